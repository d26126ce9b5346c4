"""An engine that runs a transformers causal LM, batching concurrent requests continuously.

One decoding thread owns the model. Between two decode steps it admits waiting requests (up to ``max_batch``
rows; when idle it waits ``batch_wait_s`` for company): their prompts are prefilled together, left-padded, and
their KV cache is merged into the running batch's; rows that finish leave at once. Each row keeps its own
sampling parameters and seeded generator. Logprobs are the model's own (log-softmax of the raw logits, before
temperature and top_p), as vLLM reports them by default.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
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
    """A job's progress while it is being decoded, and where its result goes."""

    job: Job
    generator: Any
    reply_to: Optional[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = None
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: Optional[str] = None
    text: Optional[str] = None

    def abandoned(self) -> bool:
        return self.reply_to is not None and self.reply_to[1].done()


class LocalEngine:
    """A transformers model behind the shared API, on the CPU or a GPU, with continuous batching."""

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
        self.peak_batch = 0
        self.counters = {"requests": 0, "tokens": 0, "busy_s": 0.0}
        self._inbox: queue.Queue = queue.Queue()
        self._worker: Optional[threading.Thread] = None
        self._start_lock = threading.Lock()

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
        """Hand one job to the decoding thread and wait for its result."""
        self._ensure_worker()
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        self._inbox.put(_Row(job, _generator(job.seed, self.device), reply_to=(loop, done)))
        return await done

    async def aclose(self) -> None:
        worker = self._worker
        if worker is not None and worker.is_alive():
            self._inbox.put(None)
            await asyncio.to_thread(worker.join)
        self._worker = None

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name="orchard-decoder", daemon=True)
                self._worker.start()

    # -- the decoding thread -----------------------------------------------------------------------

    def _serve(self) -> None:
        """Admit waiting jobs whenever there is room, advance every admitted row one token, repeat."""
        decoder = Decoder(self.model, self.tokenizer, self.device)
        while True:
            arrivals, stopping = self._take(block=not decoder.rows, room=self.max_batch - len(decoder.rows))
            if stopping:
                _fail(decoder.rows + arrivals, ModelError("the model server is shutting down"))
                return
            started = time.perf_counter()
            try:
                if arrivals:
                    decoder.admit(arrivals)
                    self.peak_batch = max(self.peak_batch, len(decoder.rows))
                if decoder.rows:
                    self.counters["tokens"] += len(decoder.rows)
                    for row in decoder.step():
                        self.counters["requests"] += 1
                        _reply(row, self._result(row))
            except Exception as e:  # a failed step fails the rows in it; the server goes on
                _fail(decoder.rows + arrivals, ModelError(f"generation failed: {type(e).__name__}: {e}"))
                decoder = Decoder(self.model, self.tokenizer, self.device)
            finally:
                self.counters["busy_s"] += time.perf_counter() - started

    def stats(self) -> dict[str, Any]:
        """What the engine has done: requests, tokens, time spent decoding, tokens/s while busy, largest batch."""
        busy = self.counters["busy_s"]
        return {**self.counters, "busy_s": round(busy, 3), "peak_batch": self.peak_batch,
                "tokens_per_busy_s": round(self.counters["tokens"] / busy, 1) if busy else None}

    def _take(self, *, block: bool, room: int) -> tuple[list[_Row], bool]:
        """Jobs waiting now (when idle: wait for one, then up to ``batch_wait_s`` for more), and whether to stop."""
        taken: list[_Row] = []
        deadline = None
        while len(taken) < room:
            try:
                if block and not taken:
                    item = self._inbox.get()
                    deadline = time.monotonic() + self.batch_wait_s
                elif deadline is not None and (left := deadline - time.monotonic()) > 0:
                    item = self._inbox.get(timeout=left)
                else:
                    item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return taken, True
            taken.append(item)
        return [row for row in taken if not row.abandoned()], False

    def run_batch(self, jobs: list[Job]) -> list[Generation]:
        """Decode ``jobs`` together in the calling thread (no queue): for tests and measurements."""
        decoder = Decoder(self.model, self.tokenizer, self.device)
        rows = [_Row(job, _generator(job.seed, self.device)) for job in jobs]
        decoder.admit(rows)
        while decoder.rows:
            decoder.step()
        return [self._result(row) for row in rows]

    def _result(self, row: _Row) -> Generation:
        if row.text is None:
            body = row.ids[:-1] if row.finish == "stop" and row.ids[-1] in self.tokenizer.stop_ids else row.ids
            row.text = self.tokenizer.decode(body)
        return Generation(token_ids=row.ids, logprobs=row.logprobs, finish_reason=row.finish or "length",
                          text=row.text, top_logprobs=row.top if row.job.top_logprobs else None)


class Decoder:
    """Rows decoded together over one KV cache; rows join (prefilled, left-padded) and leave between steps."""

    def __init__(self, model: Any, tokenizer: ChatTokenizer, device: str):
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.rows: list[_Row] = []
        self._logits = self._cache = self._mask = self._positions = None

    def admit(self, rows: list[_Row]) -> None:
        """Prefill the new rows' prompts together and merge them into the running batch."""
        import torch

        with torch.inference_mode():
            state = self._prefill([row.job.prompt_ids for row in rows])
        self.rows.extend(rows)
        if self._cache is None:
            self._logits, self._cache, self._mask, self._positions = state
        else:
            self._merge(*state)

    def step(self) -> list[_Row]:
        """Sample one token for every row; return the rows that finished (and drop them from the batch)."""
        import torch

        tokens = [self._advance(row, self._logits[i]) for i, row in enumerate(self.rows)]
        leaving = [bool(row.finish) or row.abandoned() for row in self.rows]
        keep = [i for i, gone in enumerate(leaving) if not gone]
        finished = [row for row, gone in zip(self.rows, leaving) if gone]
        if len(keep) < len(self.rows):
            self._select(keep)
        if self.rows:
            with torch.inference_mode():
                self._forward([tokens[i] for i in keep])
        return finished

    def _prefill(self, prompts: list[list[int]]) -> tuple[Any, Any, Any, Any]:
        import torch

        width = max(len(p) for p in prompts)
        pad = self.tokenizer.end_of_turn_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float(), out.cache, mask, positions[:, -1:]

    def _forward(self, tokens: list[int]) -> None:
        import torch

        ids = torch.tensor(tokens, device=self.device).unsqueeze(-1)
        self._mask = torch.cat([self._mask, self._mask.new_ones((len(tokens), 1))], dim=-1)
        self._positions = self._positions + 1
        out = self.model(input_ids=ids, attention_mask=self._mask, position_ids=self._positions, cache=self._cache,
                         use_cache=True)
        self._logits, self._cache = out.logits[:, -1, :].float(), out.cache

    def _merge(self, logits: Any, cache: Any, mask: Any, positions: Any) -> None:
        """Join two batches: the shorter one's cache and mask get padding on the left (masked out)."""
        import torch
        import torch.nn.functional as F

        old, new = self._mask.shape[1], mask.shape[1]
        width = max(old, new)
        for mine, theirs in zip(self._cache.layers, cache.layers):
            mine.keys = torch.cat([F.pad(mine.keys, (0, 0, width - old, 0)), F.pad(theirs.keys, (0, 0, width - new, 0))])
            mine.values = torch.cat([F.pad(mine.values, (0, 0, width - old, 0)),
                                     F.pad(theirs.values, (0, 0, width - new, 0))])
        self._mask = torch.cat([F.pad(self._mask, (width - old, 0)), F.pad(mask, (width - new, 0))])
        self._positions = torch.cat([self._positions, positions])
        self._logits = torch.cat([self._logits, logits])

    def _select(self, keep: list[int]) -> None:
        """Keep only these rows, and drop cache columns that are padding for every row left."""
        import torch

        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self._logits = self._cache = self._mask = self._positions = None
            return
        index = torch.tensor(keep, device=self.device)
        self._cache.batch_select_indices(index)
        self._mask, self._positions, self._logits = self._mask[index], self._positions[index], self._logits[index]
        unused = int((self._mask.sum(0) == 0).long().cumprod(0).sum())
        if unused:
            self._mask = self._mask[:, unused:]
            for layer in self._cache.layers:
                layer.keys, layer.values = layer.keys[:, :, unused:], layer.values[:, :, unused:]

    def _advance(self, row: _Row, logits: Any) -> int:
        """Sample the row's next token and record it."""
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


def _reply(row: _Row, result: Generation) -> None:
    """Hand a result to the waiting request on its own event loop (it may have gone away)."""
    loop, done = row.reply_to
    loop.call_soon_threadsafe(lambda: done.done() or done.set_result(result))


def _fail(rows: list[_Row], error: Exception) -> None:
    for row in rows:
        if row.reply_to is not None:
            loop, done = row.reply_to
            loop.call_soon_threadsafe(lambda d=done: d.done() or d.set_exception(error))


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
