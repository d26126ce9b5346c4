"""The `orchard model ...` commands: serve a model (local or scripted), prepare its cache, benchmark it."""

from __future__ import annotations

import argparse
import os


def register(subparsers: argparse._SubParsersAction) -> None:
    model = subparsers.add_parser("model", help="OpenAI-compatible model servers (local transformers or scripted)")
    commands = model.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve /v1/chat/completions with token ids and logprobs")
    serve.add_argument("--model", default=os.environ.get("ORCHARD_MODEL", "SmolLM2-135M-Instruct"),
                       help="a known name, a Hugging Face directory or a .gguf file (ORCHARD_MODEL)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--device", default="auto", help="auto (cuda when present, else cpu), cpu, cuda, cuda:1 ...")
    serve.add_argument("--served-name", help="the name /v1/models reports (default: the model's)")
    serve.add_argument("--max-batch", type=int, default=8, help="most requests decoded together")
    serve.add_argument("--batch-wait-ms", type=float, default=5.0, help="how long a batch waits for more requests")
    serve.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: one per core)")
    serve.add_argument("--scripted", action="store_true", help="serve scripted replies instead of a model")
    serve.add_argument("--script", help="JSON/YAML script of replies (implies --scripted)")
    serve.add_argument("--policy", help="MODULE:FUNC or FILE.py:FUNC, called with each request (implies --scripted)")
    serve.add_argument("--log-level", default="warning")
    serve.set_defaults(func=_serve)

    prepare = commands.add_parser("prepare", help="convert the model's GGUF once into the cache; print load times")
    prepare.add_argument("--model", default="SmolLM2-135M-Instruct")
    prepare.set_defaults(func=_prepare)

    bench = commands.add_parser("bench", help="tokens/s of the local engine at several batch sizes")
    bench.add_argument("--model", default="SmolLM2-135M-Instruct")
    bench.add_argument("--device", default="auto")
    bench.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="batch sizes to measure")
    bench.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    bench.add_argument("--repeats", type=int, default=2, help="timed rounds per batch size (after one warm-up)")
    bench.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: one per core)")
    bench.add_argument("--cold", action="store_true", help="also time a first load from the GGUF (empty cache)")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(func=_bench)


def _passive_threads() -> None:
    """Idle OpenMP threads sleep instead of spinning: on a shared CPU spinning threads steal the cores (measured:
    a decode step took 2.7x longer with spinning threads on this 2-core machine under load). Must precede torch."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _serve(args: argparse.Namespace) -> int:
    _passive_threads()
    import uvicorn

    from orchard.inference.api import create_app

    engine = _scripted_engine(args) if (args.scripted or args.script or args.policy) else _local_engine(args)
    uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level=args.log_level, loop="uvloop",
                http="httptools", access_log=False, timeout_keep_alive=75, server_header=False)
    return 0


def _scripted_engine(args: argparse.Namespace):
    from orchard.inference.scripted import ScriptedEngine, load_policy, load_script
    from orchard.inference.weights import load_tokenizer

    if bool(args.script) == bool(args.policy):
        raise SystemExit("orchard model serve --scripted needs exactly one of --script FILE or --policy MOD:FUNC")
    source = {"script": load_script(args.script)} if args.script else {"policy": load_policy(args.policy)}
    return ScriptedEngine(load_tokenizer(args.model), model_name=args.served_name or "scripted", **source)


def _local_engine(args: argparse.Namespace):
    from orchard.inference.local import LocalEngine, set_threads

    set_threads(args.threads)
    return LocalEngine.load(args.model, device=args.device, max_batch=args.max_batch,
                            batch_wait_s=args.batch_wait_ms / 1000, model_name=args.served_name)


def _prepare(args: argparse.Namespace) -> int:
    _passive_threads()
    from orchard.inference.bench import prepare

    prepare(args.model)
    return 0


def _bench(args: argparse.Namespace) -> int:
    _passive_threads()
    from orchard.inference.bench import main

    return main(args)
