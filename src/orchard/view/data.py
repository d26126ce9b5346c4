"""Read a rollout run's Parquet files into what the viewer's page shows: a filtered list and one trajectory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

from orchard.errors import NotFoundError, RequestError

LIST_COLUMNS = ["rollout_id", "task_id", "group", "sample", "harness", "model", "reward", "resolved",
                "failure_kind", "stop_reason", "n_calls", "completion_tokens", "total_s"]

Decoder = Callable[[list[int]], str]


class RunData:
    """One run directory (trajectories.parquet and samples.parquet), loaded once."""

    def __init__(self, run_dir: str | Path, decode: Optional[Decoder] = None):
        import pyarrow.parquet as pq

        self.dir = Path(run_dir)
        path = self.dir / "trajectories.parquet"
        if not path.is_file():
            raise RequestError(f"{run_dir} holds no trajectories.parquet (is it a directory written by `orchard rollout`?)")
        self.rows = {r["rollout_id"]: r for r in pq.read_table(path).to_pylist()}
        samples_path = self.dir / "samples.parquet"
        self.samples: dict[str, list[dict[str, Any]]] = {}
        if samples_path.is_file():
            for s in pq.read_table(samples_path, columns=["rollout_id", "call_index", "prompt_length", "input_ids",
                                                          "finish_reason"]).to_pylist():
                self.samples.setdefault(s["rollout_id"], []).append(s)
        self.decode = decode

    def facets(self) -> dict[str, list[str]]:
        """The values each filter can take."""
        rows = self.rows.values()
        return {"task": sorted({r["task_id"] for r in rows}), "harness": sorted({r["harness"] for r in rows}),
                "failure": sorted({r["failure_kind"] for r in rows if r["failure_kind"]})}

    def listing(self, task: str = "", harness: str = "", reward: str = "", failure: str = "") -> list[dict[str, Any]]:
        """Rows matching every given filter; reward is 'resolved', 'unresolved' or 'infra'; failure a kind or 'none'."""
        def keep(r: dict[str, Any]) -> bool:
            return ((not task or r["task_id"] == task) and (not harness or r["harness"] == harness)
                    and _reward_ok(r, reward) and _failure_ok(r, failure))
        return [{k: r[k] for k in LIST_COLUMNS} for r in self.rows.values() if keep(r)]

    def trajectory(self, rollout_id: str) -> dict[str, Any]:
        """Everything about one rollout, with turns, per-call token counts and the loss mask as runs."""
        row = self.rows.get(rollout_id)
        if row is None:
            raise NotFoundError(f"no rollout {rollout_id!r} in {self.dir}")
        calls = sorted(self.samples.get(rollout_id, []), key=lambda s: s["call_index"])
        detail = {k: v for k, v in row.items() if k not in ("input_ids", "loss_mask", "logprobs", "messages")}
        detail["turns"] = [_turn(m) for m in row["messages"] or []]
        detail["calls"] = [{"index": s["call_index"], "prompt_tokens": s["prompt_length"],
                            "completion_tokens": len(s["input_ids"]) - s["prompt_length"],
                            "finish_reason": s["finish_reason"]} for s in calls]
        detail["mask_runs"] = self._runs(row["input_ids"] or [], row["loss_mask"] or [])
        detail["tokens"] = len(row["input_ids"] or [])
        detail["trained_tokens"] = sum(row["loss_mask"] or [])
        return detail

    def _runs(self, ids: list[int], mask: list[int]) -> list[dict[str, Any]]:
        """Maximal runs of equal mask value, with their text when a tokenizer is at hand."""
        runs: list[dict[str, Any]] = []
        start = 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or mask[i] != mask[start]:
                piece = ids[start:i]
                runs.append({"mask": mask[start], "tokens": len(piece),
                             "text": self.decode(piece) if self.decode else None})
                start = i
        return runs


def _reward_ok(r: dict[str, Any], wanted: str) -> bool:
    if not wanted:
        return True
    kind = "infra" if r["failure_kind"] else ("resolved" if r["resolved"] else "unresolved")
    if wanted not in ("resolved", "unresolved", "infra"):
        raise RequestError("reward filter must be resolved, unresolved or infra")
    return kind == wanted


def _failure_ok(r: dict[str, Any], wanted: str) -> bool:
    if not wanted:
        return True
    return (r["failure_kind"] or "none") == wanted


def _turn(m: dict[str, Any]) -> dict[str, Any]:
    """A message as the page shows it: thought text, tool calls (name + arguments) or an observation."""
    calls = json.loads(m["tool_calls"]) if m.get("tool_calls") else []
    return {"role": m["role"], "content": m["content"], "tool_call_id": m.get("tool_call_id"),
            "tool_calls": [{"name": (c.get("function") or {}).get("name"),
                            "arguments": (c.get("function") or {}).get("arguments")} for c in calls]}
