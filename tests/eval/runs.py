"""Synthetic rollout runs written with the engine's own schema, for eval and viewer tests."""

from __future__ import annotations

import json
from pathlib import Path

from orchard.rollout.schema import empty_row, write_tables


def make_run(out: Path, outcomes: dict[str, list], group_of=lambda t: t.split("-")[0], harness: str = "minimal") -> Path:
    """One row per outcome: True/False = resolved or not, a string = that infrastructure failure kind."""
    rows, samples = [], []
    for task, results in outcomes.items():
        for i, result in enumerate(results):
            row = empty_row()
            rid = f"{task}#{i}"
            row.update(rollout_id=rid, task_id=task, group=group_of(task), sample=i, harness=harness,
                       model="http://m", instruction=f"fix {task}", total_s=10.0, sandbox_s=3.0, harness_s=5.0,
                       grade_s=1.5, proxy_s=0.25, overhead_s=0.25, model_s=2.0)
            if isinstance(result, str):
                row.update(failure_kind=result, error="boom")
            else:
                row.update(reward=float(result), resolved=result, stop_reason="submitted", n_calls=2,
                           patch="--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a < b\n+a <= b\n",
                           messages=[{"role": "user", "content": f"fix {task}", "tool_calls": None, "tool_call_id": None},
                                     {"role": "assistant", "content": "Let me look.", "tool_call_id": None,
                                      "tool_calls": json.dumps([{"id": "c1", "type": "function", "function":
                                                                 {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}])},
                                     {"role": "tool", "content": "x.py", "tool_calls": None, "tool_call_id": "c1"}],
                           input_ids=[1, 2, 3, 4, 5, 6], loss_mask=[0, 0, 1, 1, 0, 1], logprobs=[0.0] * 6)
                samples.append({"rollout_id": rid, "task_id": task, "session_id": "s", "call_index": 0,
                                "input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1], "logprobs": [0.0] * 4,
                                "prompt_length": 2, "finish_reason": "tool_calls", "reward": float(result)})
            rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    write_tables(rows, samples, out)
    return out
