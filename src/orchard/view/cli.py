"""`orchard view DIR [--port] [--host]`: serve the trajectory viewer over a rollout run."""

from __future__ import annotations

import argparse


def _decoder(enabled: bool):
    """The SmolLM2 tokenizer's decode, so the loss mask shows text (None when off or unavailable)."""
    if not enabled:
        return None
    try:
        from orchard.inference.weights import load_tokenizer
        tok = load_tokenizer()
    except Exception as exc:  # optional nicety: the page shows token counts instead
        print(f"no tokenizer ({exc}); the loss mask shows token counts")
        return None
    return lambda ids: tok.decode(ids)


def _view(args: argparse.Namespace) -> int:
    from orchard.rollout.cli import _reported
    return _reported(lambda: _view_run(args))


def _view_run(args: argparse.Namespace) -> int:
    import uvicorn

    from orchard.view.app import create_app

    app = create_app(args.run_dir, _decoder(not args.no_decode))
    print(f"viewer for {args.run_dir} at http://{args.host}:{args.port}/", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("view", help="web page listing a run's rollouts and showing trajectories")
    parser.add_argument("run_dir", help="a directory written by `orchard rollout`")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--no-decode", action="store_true", help="show token counts, not text, in the loss mask")
    parser.set_defaults(func=_view)
