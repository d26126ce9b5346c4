"""Export a proxy store as Parquet datasets: sessions, calls, per-call samples and stitched trajectories."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from orchard.errors import RequestError
from orchard.proxy.recorder import CALLS, SESSIONS, load_call, read_records
from orchard.proxy.stitching import samples, stitch
from orchard.records import ModelCall


def load_store(store_dir: str | Path) -> tuple[dict[str, list[ModelCall]], dict[str, dict[str, Any]]]:
    """Every recorded call grouped by session, and each session's last known state (status, reward, metadata)."""
    if not (Path(store_dir) / CALLS).exists():
        raise RequestError(f"{store_dir} is not a proxy store (no {CALLS})")
    calls: dict[str, list[ModelCall]] = defaultdict(list)
    for record in read_records(store_dir, CALLS):
        calls[record["session_id"]].append(load_call(record))
    return dict(calls), _session_states(store_dir)


def _session_states(store_dir: str | Path) -> dict[str, dict[str, Any]]:
    states: dict[str, dict[str, Any]] = {}
    for event in read_records(store_dir, SESSIONS):
        state = states.setdefault(event["id"], {"session_id": event["id"], "status": "open", "reason": None,
                                                "reward": None, "reward_info": "{}", "metadata": "{}", "created_at": None})
        if event["event"] == "created":
            state["metadata"] = json.dumps(event.get("options", {}).get("metadata", {}))
            state["created_at"] = event.get("created_at")
        elif event["event"] == "reward":
            state["reward"], state["reward_info"] = event["reward"], json.dumps(event.get("info", {}))
        elif event["event"] == "status":
            state["status"], state["reason"] = event["status"], event.get("reason")
    return states


def _rows(store_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    calls, states = load_store(store_dir)
    rows: dict[str, list[dict[str, Any]]] = {"sessions": [], "calls": [], "samples": [], "trajectories": []}
    for session_id in sorted(states):
        reward = states[session_id]["reward"]
        session_calls = calls.get(session_id, [])
        rows["sessions"].append(states[session_id] | {"calls": len(session_calls),
                                                      "infra_failures": sum(c.infra_failure for c in session_calls)})
        rows["calls"] += [_call_row(c) for c in sorted(session_calls, key=lambda c: c.index)]
        rows["samples"] += [s.model_dump() for s in samples(session_calls, reward)]
        rows["trajectories"] += [t.model_dump() for t in stitch(session_calls, reward)]
    return rows


def _call_row(call: ModelCall) -> dict[str, Any]:
    row = call.model_dump(exclude={"timings"}) | call.timings.model_dump()
    for key in ("request", "upstream_request", "reply"):
        row[key] = json.dumps(row[key], ensure_ascii=False) if row[key] is not None else None
    return row


def _schemas() -> dict[str, Any]:
    import pyarrow as pa

    ids, floats, text = pa.list_(pa.int64()), pa.list_(pa.float64()), pa.string()
    return {
        "sessions": pa.schema([("session_id", text), ("status", text), ("reason", text), ("reward", pa.float64()),
                               ("reward_info", text), ("metadata", text), ("created_at", pa.float64()),
                               ("calls", pa.int64()), ("infra_failures", pa.int64())]),
        "calls": pa.schema([("session_id", text), ("index", pa.int64()), ("dialect", text), ("request", text),
                            ("upstream_request", text), ("reply", text), ("prompt_token_ids", ids),
                            ("completion_token_ids", ids), ("logprobs", floats), ("finish_reason", text),
                            ("text_only", pa.bool_()), ("status", text), ("error", text), ("infra_failure", pa.bool_()),
                            ("notes", pa.list_(text)), ("started_at", pa.float64()), ("upstream_s", pa.float64()),
                            ("total_s", pa.float64())]),
        "samples": pa.schema([("session_id", text), ("call_index", pa.int64()), ("dialect", text), ("input_ids", ids),
                              ("loss_mask", pa.list_(pa.int8())), ("logprobs", floats), ("prompt_length", pa.int64()),
                              ("finish_reason", text), ("reward", pa.float64())]),
        "trajectories": pa.schema([("session_id", text), ("branch", pa.int64()), ("calls", ids), ("input_ids", ids),
                                   ("loss_mask", pa.list_(pa.int8())), ("logprobs", floats), ("reward", pa.float64()),
                                   ("parent_branch", pa.int64()), ("ambiguous", pa.bool_()), ("candidate_parents", ids)]),
    }


def export(store_dir: str | Path, out_dir: str | Path) -> dict[str, int]:
    """Write sessions, calls, samples and trajectories ``.parquet`` files under ``out_dir``; return the row counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, schemas = _rows(store_dir), _schemas()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, table_rows in rows.items():
        pq.write_table(pa.Table.from_pylist(table_rows, schema=schemas[name]), out / f"{name}.parquet")
    return {name: len(table_rows) for name, table_rows in rows.items()}
