"""`orchard model bench` and `orchard model prepare`: load times and decode tokens/s of the local engine, printed.

Each batch size is compared with plain transformers ``generate()`` on the same weights in the same run.
Tokens/s are given against wall time and against the process's CPU time: on a shared machine the second says
what the engine does with the CPU it actually got (with ``--threads 1``, roughly the rate on one free core).
"""

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
            if saved is None:
                os.environ.pop("ORCHARD_MODEL_CACHE")
            else:
                os.environ["ORCHARD_MODEL_CACHE"] = saved


async def _round(engine: Any, batch: int, max_tokens: int) -> dict[str, Any]:
    """``batch`` requests submitted at once (one batch), each decoding exactly ``max_tokens`` tokens."""
    from orchard.inference.local import Job

    jobs = [Job(prompt_ids=engine.tokenizer.prompt_ids([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]),
                max_tokens=max_tokens, temperature=0.0, ignore_eos=True) for i in range(batch)]
    engine.peak_batch = 0
    started, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(engine.submit(job) for job in jobs))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    tokens = sum(len(r.token_ids) for r in results)
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens, "peak_batch": engine.peak_batch}


async def _measure(engine: Any, batch: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    await _round(engine, batch, 4)  # warm-up: allocator, kernels
    rounds = [await _round(engine, batch, max_tokens) for _ in range(repeats)]
    best = max(rounds, key=lambda r: r["tokens"] / r["seconds"])
    return {"batch": batch, "tokens_per_s": round(best["tokens"] / best["seconds"], 1),
            "tokens_per_cpu_s": round(best["tokens"] / best["cpu_seconds"], 1), "cpu_seconds": round(best["cpu_seconds"], 2),
            "tokens": best["tokens"], "seconds": round(best["seconds"], 2), "peak_batch": best["peak_batch"],
            "all_tokens_per_s": [round(r["tokens"] / r["seconds"], 1) for r in rounds]}


async def _measure_all(engine: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    try:
        results = [await _measure(engine, batch, args.max_tokens, args.repeats) for batch in args.batch]
    finally:
        await engine.aclose()
    for result in results:
        result["baseline_generate_tokens_per_s"] = baseline(engine, result["batch"], args.max_tokens)
        result["vs_baseline"] = round(result["tokens_per_s"] / result["baseline_generate_tokens_per_s"], 2)
    return results


def baseline(engine: Any, batch: int, max_tokens: int) -> float:
    """Plain transformers ``generate()`` (greedy, left-padded batch) on the same weights: the yardstick."""
    import torch

    tokenizer, model = engine.tokenizer, engine.model
    prompts = [tokenizer.prompt_ids([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]) for i in range(batch)]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=engine.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=engine.device)
    run = dict(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(**run, max_new_tokens=4, min_new_tokens=4)
        started = time.perf_counter()
        model.generate(**run, max_new_tokens=max_tokens, min_new_tokens=max_tokens)
    return round(batch * max_tokens / (time.perf_counter() - started), 1)


def main(args: argparse.Namespace) -> int:
    from orchard.inference.local import LocalEngine, set_threads

    set_threads(args.threads)
    started = time.perf_counter()
    engine = LocalEngine.load(args.model, device=args.device, max_batch=max(args.batch), batch_wait_s=0.2)
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
        print(f"batch {r['batch']:>2}: {r['tokens_per_s']:>7.1f} tokens/s wall, {r['tokens_per_cpu_s']:>7.1f} per CPU-second "
              f"({r['tokens']} tokens in {r['seconds']} s, {r['cpu_seconds']} CPU-s; "
              f"rows decoded together {r['peak_batch']}; rounds {r['all_tokens_per_s']}); plain generate() "
              f"{r['baseline_generate_tokens_per_s']} tokens/s, ratio {r['vs_baseline']}")
