"""`orchard model bench` and `orchard model prepare`: load times and decode tokens/s of the local engine, printed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from typing import Any

PROMPTS = [
    "Explain what a sandbox is in one paragraph.",
    "Write a short poem about the sea.",
    "List three uses of a hash map.",
    "What does `git rebase` do?",
    "Describe a cat to someone who has never seen one.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "Summarise the plot of a detective story you invent.",
]


def prepare(model: str) -> dict[str, Any]:
    """Convert the model into the cache if needed; print how long that took and how long a cached load takes."""
    from orchard.inference.weights import is_cached, load_model, model_dir

    figures: dict[str, Any] = {"model": model}
    if not is_cached(model):
        started = time.perf_counter()
        model_dir(model)
        figures["converted_s"] = round(time.perf_counter() - started, 2)
        print(f"converted {model} from GGUF in {figures['converted_s']} s")
    started = time.perf_counter()
    load_model(model)
    figures["cached_load_s"] = round(time.perf_counter() - started, 2)
    print(f"cached load of {model}: {figures['cached_load_s']} s ({model_dir(model)})")
    return figures


def cold_load_seconds(model: str) -> float:
    """GGUF to a loaded model through an empty cache: what the first start on a machine costs."""
    from orchard.inference.weights import load_model

    saved = os.environ.get("ORCHARD_MODEL_CACHE")
    with tempfile.TemporaryDirectory(prefix="orchard-cold-") as scratch:
        os.environ["ORCHARD_MODEL_CACHE"] = scratch
        try:
            started = time.perf_counter()
            load_model(model)
            return time.perf_counter() - started
        finally:
            os.environ.pop("ORCHARD_MODEL_CACHE") if saved is None else os.environ.update(ORCHARD_MODEL_CACHE=saved)


async def _round(engine: Any, batch: int, max_tokens: int) -> dict[str, Any]:
    """``batch`` requests submitted at once (one batch), each decoding exactly ``max_tokens`` tokens."""
    from orchard.inference.local import Job

    jobs = [Job(prompt_ids=engine.tokenizer.prompt_ids([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]),
                max_tokens=max_tokens, temperature=0.0, ignore_eos=True) for i in range(batch)]
    engine.batch_sizes.clear()
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.submit(job) for job in jobs))
    seconds = time.perf_counter() - started
    tokens = sum(len(r.token_ids) for r in results)
    return {"seconds": seconds, "tokens": tokens, "batches": list(engine.batch_sizes)}


async def _measure(engine: Any, batch: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    await _round(engine, batch, 4)  # warm-up: allocator, kernels
    rounds = [await _round(engine, batch, max_tokens) for _ in range(repeats)]
    best = max(rounds, key=lambda r: r["tokens"] / r["seconds"])
    return {"batch": batch, "tokens_per_s": round(best["tokens"] / best["seconds"], 1),
            "tokens": best["tokens"], "seconds": round(best["seconds"], 2), "batches_formed": best["batches"],
            "all_tokens_per_s": [round(r["tokens"] / r["seconds"], 1) for r in rounds]}


async def _measure_all(engine: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    try:
        return [await _measure(engine, batch, args.max_tokens, args.repeats) for batch in args.batch]
    finally:
        await engine.aclose()


def main(args: argparse.Namespace) -> int:
    from orchard.inference.local import LocalEngine, set_threads

    set_threads(args.threads)
    started = time.perf_counter()
    engine = LocalEngine.load(args.model, device=args.device, max_batch=max(args.batch), batch_wait_s=0.05)
    report: dict[str, Any] = {"model": args.model, "device": engine.device, "max_tokens": args.max_tokens,
                              "cpu_count": os.cpu_count(), "threads": _threads(), "load_s": round(time.perf_counter() - started, 2),
                              "loadavg_before": os.getloadavg()[0], "results": []}
    report["results"] = asyncio.run(_measure_all(engine, args))
    report["loadavg_after"] = os.getloadavg()[0]
    if args.cold:
        report["cold_load_s"] = round(cold_load_seconds(args.model), 2)
    _print(report, args.json)
    return 0


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _print(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report))
        return
    print(f"{report['model']} on {report['device']} ({report['cpu_count']} CPUs, {report['threads']} torch threads, load average "
          f"{report['loadavg_before']:.1f} before, {report['loadavg_after']:.1f} after); "
          f"cached load {report['load_s']} s" + (f", cold (GGUF) load {report['cold_load_s']} s" if "cold_load_s" in report else ""))
    for r in report["results"]:
        print(f"batch {r['batch']:>2}: {r['tokens_per_s']:>7.1f} tokens/s ({r['tokens']} tokens in {r['seconds']} s; "
              f"batches formed {r['batches_formed']}; rounds {r['all_tokens_per_s']})")
