"""The rollout dataset's Parquet schema: one row per trajectory, one row per model call (sample)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

MESSAGE = pa.struct([
    ("role", pa.string()),            # system | user | assistant | tool
    ("content", pa.string()),         # text (None when an assistant turn is only tool calls)
    ("tool_calls", pa.string()),      # JSON list of OpenAI tool calls on assistant turns, else None
    ("tool_call_id", pa.string()),    # on tool turns: the call it answers
])

TRAJECTORY = pa.schema([
    ("rollout_id", pa.string()),      # "<task_id>#<sample>", unique within a run
    ("task_id", pa.string()),
    ("group", pa.string()),           # package (SWE) or category (terminal) of the task
    ("sample", pa.int32()),           # 0..K-1
    ("harness", pa.string()),
    ("model", pa.string()),           # the model endpoint URL the proxy forwarded to
    ("instruction", pa.string()),
    ("messages", pa.list_(MESSAGE)),  # the conversation of the main branch, as the model saw it
    ("reward", pa.float64()),         # None for infrastructure failures
    ("resolved", pa.bool_()),         # None for infrastructure failures
    ("failure_kind", pa.string()),    # None, or sandbox | proxy | upstream | grader | harness (infrastructure)
    ("error", pa.string()),           # what went wrong (infrastructure failure or harness error)
    ("stop_reason", pa.string()),     # how the harness ended: submitted | budget | error | ...
    ("attempts", pa.int32()),         # 1 + infrastructure retries
    ("patch", pa.string()),           # final `git diff` of the task's work tree
    ("grade_detail", pa.string()),    # grader's summary (tests failed/passed, checker output tail)
    ("session_id", pa.string()),      # proxy session
    ("n_calls", pa.int32()),
    ("prompt_tokens", pa.int64()),    # sum over calls
    ("completion_tokens", pa.int64()),
    ("input_ids", pa.list_(pa.int32())),   # stitched main branch: whole conversation tokens
    ("loss_mask", pa.list_(pa.int8())),    # 1 exactly on sampled tokens
    ("logprobs", pa.list_(pa.float32())),
    ("n_branches", pa.int32()),       # stitched branches in the session (>1: history was rewritten)
    ("started_at", pa.float64()),     # unix time
    ("total_s", pa.float64()),        # wall time of the successful (or last) attempt
    ("sandbox_s", pa.float64()),      # create + setup + patch collection + delete
    ("harness_s", pa.float64()),      # the harness run, model calls included
    ("model_s", pa.float64()),        # time the proxy waited on the upstream model (inside harness_s)
    ("grade_s", pa.float64()),        # grading, in its own fresh sandbox
    ("proxy_s", pa.float64()),        # proxy bookkeeping: open the session, fetch its record, attach the reward
    ("overhead_s", pa.float64()),     # total - sandbox - harness - grade - proxy: the engine's own time
])

SAMPLE = pa.schema([
    ("rollout_id", pa.string()),
    ("task_id", pa.string()),
    ("session_id", pa.string()),
    ("call_index", pa.int32()),
    ("input_ids", pa.list_(pa.int32())),   # prompt ids + completion ids
    ("loss_mask", pa.list_(pa.int8())),    # 0 on the prompt, 1 on the completion
    ("logprobs", pa.list_(pa.float32())),
    ("prompt_length", pa.int32()),
    ("finish_reason", pa.string()),
    ("reward", pa.float64()),
])


def empty_row() -> dict[str, Any]:
    """A trajectory row with every field present (None or empty)."""
    row: dict[str, Any] = {name: None for name in TRAJECTORY.names}
    row.update(messages=[], input_ids=[], loss_mask=[], logprobs=[], attempts=1, n_calls=0, n_branches=0,
               prompt_tokens=0, completion_tokens=0)
    return row


def write_tables(rows: list[dict[str, Any]], samples: list[dict[str, Any]], out_dir) -> None:
    """trajectories.parquet and samples.parquet under out_dir."""
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows, schema=TRAJECTORY), f"{out_dir}/trajectories.parquet")
    pq.write_table(pa.Table.from_pylist(samples, schema=SAMPLE), f"{out_dir}/samples.parquet")
