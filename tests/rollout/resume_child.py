"""A rollout run in its own process, for the resume test to kill: python -m tests.rollout.resume_child ENV PROXY OUT."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from orchard.rollout.tasks import SuiteTask, echo_tasks
from tests.rollout.test_engine import run_engine

if __name__ == "__main__":
    env_url, proxy_url, out = sys.argv[1:4]
    tasks = [SuiteTask(t) for t in echo_tasks(6)]
    asyncio.run(run_engine(env_url, proxy_url, Path(out), tasks, samples=2, concurrency=2, resume=True))
