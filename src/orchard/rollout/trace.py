"""Turn a proxy session's record into dataset fields: messages, token arrays, samples, counts."""

from __future__ import annotations

import json
from typing import Any, Optional

from orchard.records import ModelCall
from orchard.rollout.parts import SessionRecord


def _text(content: Any) -> Optional[str]:
    """Message content as one string (OpenAI content parts joined)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return json.dumps(content)


def _message(m: dict[str, Any]) -> dict[str, Any]:
    calls = m.get("tool_calls")
    return {"role": m.get("role"), "content": _text(m.get("content")),
            "tool_calls": json.dumps(calls) if calls else None, "tool_call_id": m.get("tool_call_id")}


def _main_call(record: SessionRecord) -> Optional[ModelCall]:
    """The last call of the longest stitched branch (or the last successful call when nothing was stitched)."""
    ok = {c.index: c for c in record.calls if c.status == "ok" and c.reply}
    if record.trajectories:
        main = max(record.trajectories, key=lambda t: len(t.input_ids))
        for index in reversed(main.calls):
            if index in ok:
                return ok[index]
    return ok[max(ok)] if ok else None


def messages_of(record: SessionRecord) -> list[dict[str, Any]]:
    """The main branch's conversation: the last call's prompt messages plus the model's reply."""
    call = _main_call(record)
    if call is None:
        return []
    sent = (call.upstream_request or call.request).get("messages", [])
    reply = (call.reply.get("choices") or [{}])[0].get("message") or {}
    return [_message(m) for m in sent] + ([_message({"role": "assistant", **reply})] if reply else [])


def stats_of(record: SessionRecord) -> dict[str, Any]:
    """Token arrays of the main branch and per-session counts."""
    main = max(record.trajectories, key=lambda t: len(t.input_ids)) if record.trajectories else None
    return {
        "n_calls": len(record.calls), "n_branches": len(record.trajectories),
        "prompt_tokens": sum(len(c.prompt_token_ids) for c in record.calls),
        "completion_tokens": sum(len(c.completion_token_ids) for c in record.calls),
        "model_s": sum(c.timings.upstream_s for c in record.calls),
        "input_ids": main.input_ids if main else [], "loss_mask": main.loss_mask if main else [],
        "logprobs": main.logprobs if main else [],
    }


def samples_of(record: SessionRecord, rollout_id: str, task_id: str, reward: float) -> list[dict[str, Any]]:
    """One sample per successful call with token ids: prompt (mask 0) then completion (mask 1)."""
    out = []
    for c in record.calls:
        if c.status != "ok" or not c.completion_token_ids:
            continue
        n_p, n_c = len(c.prompt_token_ids), len(c.completion_token_ids)
        out.append({"rollout_id": rollout_id, "task_id": task_id, "session_id": c.session_id, "call_index": c.index,
                    "input_ids": c.prompt_token_ids + c.completion_token_ids, "loss_mask": [0] * n_p + [1] * n_c,
                    "logprobs": [0.0] * n_p + list(c.logprobs), "prompt_length": n_p,
                    "finish_reason": c.finish_reason, "reward": reward})
    return out
