"""Attach cost of the container backend's replicas: ``python -m tests.env.replicas.bench_container``.

Two replicas over one redis-server and one private Podman API service (as test_container_replicas
starts them); for each exec path, sandboxes created through replica a get their first `true` exec
through replica b (which attaches to the container: one engine inspect, plus the bash check) and then
ten more; prints the p50 of each through the SDK.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from tests.env.podman_api import podman_engine
from tests.env.replicas.test_container_replicas import ContainerReplicas

SANDBOXES, LATER = 3, 10


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1e3


def measure(engine, mode: str) -> str:
    replicas = ContainerReplicas(Path(tempfile.mkdtemp(prefix="orchard-bench-")), engine, mode)
    try:
        firsts, later = [], []
        for _ in range(SANDBOXES):
            on_b = replicas.b.get_sandbox(replicas.a.create_sandbox("host", timeout=120).sandbox_id)
            firsts.append(_timed(lambda: on_b.exec("true")))
            later += [_timed(lambda: on_b.exec("true")) for _ in range(LATER)]
        return (f"{mode}: first exec on the other replica p50 {statistics.median(firsts):.1f} ms (n={len(firsts)}), "
                f"later execs p50 {statistics.median(later):.1f} ms (n={len(later)})")
    finally:
        replicas.close()


def main() -> None:
    engines = podman_engine()
    engine = next(engines)
    try:
        for mode in ("auto", "api"):
            print(measure(engine, mode))
    finally:
        engines.close()


if __name__ == "__main__":
    main()
