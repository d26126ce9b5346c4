"""An engine that runs a transformers causal LM, batching concurrent requests together.

Requests wait in a queue; a batcher takes the first one, collects more for ``batch_wait_s`` (up to
``max_batch``) and decodes them together with left padding and one KV cache, each row with its own sampling
parameters and seeded generator. A batch runs to its last row's end; requests that arrive meanwhile form the
next batch. Logprobs are the model's own (log-softmax of the raw logits, before temperature and top_p), as vLLM
reports them by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from orchard.errors import ModelError
from orchard.inference.api import ChatRequest, Generation
from orchard.inference.chat import ChatTokenizer


@dataclass
class Job:
    """One request's work: its prompt, sampling parameters and budget."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    top_logprobs: int = 0
    ignore_eos: bool = False


@dataclass
class _Row:
    """A job's progress inside a running batch."""

    job: Job
    generator: Any
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: Optional[str] = None
    text: Optional[str] = None


class LocalEngine:
    """A transformers model behind the shared API, on the CPU or a GPU."""

    def __init__(self, model: Any, tokenizer: ChatTokenizer, *, device: str = "cpu", max_batch: int = 8,
                 batch_wait_s: float = 0.005, model_name: Optional[str] = None, default_max_tokens: int = 1024):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.model_name = model_name or tokenizer.name
        self.max_context = int(getattr(model.config, "max_position_embeddings", 2048))
        self.default_max_tokens = default_max_tokens
        self.batch_sizes: list[int] = []
        self._queue: Optional[asyncio.Queue] = None
        self._worker: Optional[asyncio.Task] = None

    @classmethod
    def load(cls, model: str = "SmolLM2-135M-Instruct", *, device: str = "auto", **kwargs: Any) -> "LocalEngine":
        """Load (converting and caching on first use) a model and its tokenizer."""
        from orchard.inference.weights import load_model, load_tokenizer

        device = pick_device(device)
        return cls(load_model(model, device=device), load_tokenizer(model), device=device, **kwargs)

    # -- the async side ----------------------------------------------------------------------------

    async def generate(self, request: ChatRequest, prompt_ids: list[int], max_tokens: int) -> Generation:
        job = Job(prompt_ids=prompt_ids, max_tokens=max_tokens, seed=request.seed, stop=request.stop_strings(),
                  temperature=1.0 if request.temperature is None else request.temperature,
                  top_p=1.0 if request.top_p is None else request.top_p,
                  top_logprobs=(request.top_logprobs or 0) if request.logprobs else 0, ignore_eos=request.ignore_eos)
        return await self.submit(job)

    async def submit(self, job: Job) -> Generation:
        """Queue one job and wait for its batch to finish it."""
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not asyncio.get_running_loop():
            self._queue = asyncio.Queue()  # the first request on this event loop starts its batcher
            self._worker = asyncio.create_task(self._batcher())
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        await self._queue.put((job, done))
        return await done

    async def aclose(self) -> None:
        if self._worker is not None and self._worker.get_loop() is asyncio.get_running_loop():
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    async def _batcher(self) -> None:
        while True:
            batch = await self._collect()
            jobs = [job for job, _ in batch]
            try:
                results = await asyncio.to_thread(self.run_batch, jobs)
            except Exception as e:  # the whole batch failed: every waiting request hears why
                failure = ModelError(f"generation failed: {type(e).__name__}: {e}")
                for _, done in batch:
                    if not done.done():
                        done.set_exception(failure)
                continue
            for (_, done), result in zip(batch, results):
                if not done.done():
                    done.set_result(result)

    async def _collect(self) -> list[tuple[Job, asyncio.Future]]:
        batch = [await self._queue.get()]
        deadline = asyncio.get_running_loop().time() + self.batch_wait_s
        while len(batch) < self.max_batch:
            left = deadline - asyncio.get_running_loop().time()
            try:
                batch.append(self._queue.get_nowait() if left <= 0 else await asyncio.wait_for(self._queue.get(), left))
            except (asyncio.QueueEmpty, asyncio.TimeoutError):
                break
        return batch

    # -- the decoding loop (runs in a worker thread) -----------------------------------------------

    def run_batch(self, jobs: list[Job]) -> list[Generation]:
        """Decode ``jobs`` together: one prefill over the left-padded prompts, then one token per row per step."""
        import torch

        self.batch_sizes.append(len(jobs))
        rows = [_Row(job, _generator(job.seed, self.device)) for job in jobs]
        with torch.inference_mode():
            logits, cache, mask, positions = self._prefill(jobs)
            for _ in range(max(job.max_tokens for job in jobs)):
                tokens = [self._advance(row, logits[i]) for i, row in enumerate(rows)]
                if all(row.finish for row in rows):
                    break
                logits, cache, mask, positions = self._step(tokens, cache, mask, positions)
        return [self._result(row) for row in rows]

    def _prefill(self, jobs: list[Job]) -> tuple[Any, Any, Any, Any]:
        import torch

        width = max(len(job.prompt_ids) for job in jobs)
        pad = self.tokenizer.end_of_turn_id
        ids = torch.tensor([[pad] * (width - len(j.prompt_ids)) + j.prompt_ids for j in jobs], device=self.device)
        mask = torch.tensor([[0] * (width - len(j.prompt_ids)) + [1] * len(j.prompt_ids) for j in jobs],
                            device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float(), out.cache, mask, positions[:, -1:]

    def _step(self, tokens: list[int], cache: Any, mask: Any, positions: Any) -> tuple[Any, Any, Any, Any]:
        import torch

        ids = torch.tensor(tokens, device=self.device).unsqueeze(-1)
        mask = torch.cat([mask, mask.new_ones((len(tokens), 1))], dim=-1)
        positions = positions + 1
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        return out.logits[:, -1, :].float(), out.cache, mask, positions

    def _advance(self, row: _Row, logits: Any) -> int:
        """Sample the row's next token and record it; a finished row just feeds padding."""
        if row.finish:
            return self.tokenizer.end_of_turn_id
        token, logprob, top = sample(logits, row.job, row.generator)
        row.ids.append(token)
        row.logprobs.append(logprob)
        row.top.append(top)
        self._check_end(row, token)
        return token

    def _check_end(self, row: _Row, token: int) -> None:
        if token in self.tokenizer.stop_ids and not row.job.ignore_eos:
            row.finish = "stop"
        elif row.job.stop and _cut_at_stop(row, self.tokenizer):
            row.finish = "stop"
        elif len(row.ids) >= row.job.max_tokens:
            row.finish = "length"

    def _result(self, row: _Row) -> Generation:
        if row.text is None:
            body = row.ids[:-1] if row.finish == "stop" and row.ids[-1] in self.tokenizer.stop_ids else row.ids
            row.text = self.tokenizer.decode(body)
        return Generation(token_ids=row.ids, logprobs=row.logprobs, finish_reason=row.finish or "length",
                          text=row.text, top_logprobs=row.top if row.job.top_logprobs else None)


def sample(logits: Any, job: Job, generator: Any) -> tuple[int, float, list[tuple[int, float]]]:
    """One token from one row's logits: greedy at temperature 0, else temperature and top_p, seeded."""
    import torch

    logprobs = torch.log_softmax(logits, dim=-1)
    if job.temperature == 0:
        token = int(torch.argmax(logits))
    else:
        probs = torch.softmax(logits / job.temperature, dim=-1)
        if job.top_p < 1.0:
            probs = _nucleus(probs, job.top_p)
        token = int(torch.multinomial(probs, 1, generator=generator))
    top: list[tuple[int, float]] = []
    if job.top_logprobs:
        values, indices = torch.topk(logprobs, job.top_logprobs)
        top = [(int(i), float(v)) for v, i in zip(values, indices)]
    return token, float(logprobs[token]), top


def _nucleus(probs: Any, top_p: float) -> Any:
    """Keep the smallest set of likeliest tokens whose mass reaches ``top_p``."""
    import torch

    sorted_probs, order = torch.sort(probs, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs[before >= top_p] = 0.0
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def _cut_at_stop(row: _Row, tokenizer: ChatTokenizer) -> bool:
    """Whether a stop string has appeared; if so the row's text ends just before it."""
    text = tokenizer.decode(row.ids)
    found = [i for i in (text.find(s) for s in row.job.stop) if i >= 0]
    if not found:
        return False
    row.text = text[:min(found)]
    return True


def _generator(seed: Optional[int], device: str) -> Any:
    import torch

    generator = torch.Generator(device=device)
    generator.manual_seed(seed % 2**63 if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
    return generator


def set_threads(threads: int) -> None:
    """Use ``threads`` CPU threads for torch (0 keeps torch's default, one per core)."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


def pick_device(device: str) -> str:
    """``auto`` is the first GPU when torch sees one, else the CPU."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
