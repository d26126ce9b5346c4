"""Run the fake Kubernetes API server and kubelet: ``python -m tests.env.kube_fake --port N --root DIR``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from .api import FakeApiServer, Store
from .kubelet import DEFAULT_IMAGES, Kubelet

NODE = {"metadata": {"name": "fake-node"}, "spec": {},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", type=Path, required=True, help="agent image and pod volumes")
    parser.add_argument("--namespace", action="append", default=[], help="namespaces that exist (repeatable)")
    parser.add_argument("--image", action="append", default=[], help="images the fake registry holds (repeatable)")
    args = parser.parse_args()
    store = Store(args.namespace or ["orchard-sandboxes"])
    kubelet = Kubelet(store, args.root, frozenset(args.image) or DEFAULT_IMAGES)
    server = FakeApiServer(("127.0.0.1", args.port), store, [NODE])

    def stop(*_) -> None:
        server.stopping.set()
        kubelet.stop_all()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"fake kubernetes api on http://127.0.0.1:{args.port}", flush=True)
    server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
