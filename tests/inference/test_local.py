"""The transformers engine with the real SmolLM2-135M: wire shape, seeds, batching, stop strings, logprobs.

One model is loaded for the whole module; every generation is a few tokens so the module stays quick on a CPU.
"""

from __future__ import annotations

import asyncio
import math

import pytest
from fastapi.testclient import TestClient

from orchard.inference.api import create_app
from orchard.inference.local import Job, LocalEngine, sample

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engine() -> LocalEngine:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a shared, loaded CPU one thread is steadier than several contending ones
    yield LocalEngine.load(device="cpu", max_batch=8, batch_wait_s=0.05)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def client(engine) -> TestClient:
    with TestClient(create_app(engine)) as client:
        yield client


def _ask(client, messages=QUESTION, **extra):
    response = client.post("/v1/chat/completions", json={"messages": messages, "logprobs": True, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_greedy_reply_has_aligned_ids_and_logprobs(client, engine):
    reply = _ask(client, temperature=0, max_tokens=4, top_logprobs=3)
    choice = reply["choices"][0]
    assert reply["prompt_token_ids"] == engine.tokenizer.prompt_ids(QUESTION)
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 4
    entries = choice["logprobs"]["content"]
    assert [e["bytes"] for e in entries] == [list(engine.tokenizer.piece(i)[1]) for i in choice["token_ids"]]
    assert all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 3 for e in entries)
    # greedy: each sampled token is the likeliest one, and its logprob is that alternative's
    assert all(math.isclose(e["logprob"], e["top_logprobs"][0]["logprob"]) and e["token"] == e["top_logprobs"][0]["token"]
               for e in entries)
    assert choice["message"]["content"] == engine.tokenizer.decode(choice["token_ids"])
    assert reply["usage"]["completion_tokens"] == 4
    stats = client.get("/health").json()["stats"]
    assert stats["requests"] >= 1 and stats["tokens"] >= 4 and stats["tokens_per_busy_s"] > 0


def test_same_seed_same_tokens(client):
    story = [{"role": "user", "content": "Start a story about anything."}]
    runs = [_ask(client, story, temperature=1.2, top_p=0.95, seed=seed, max_tokens=4)["choices"][0]["token_ids"]
            for seed in (11, 11, 12, 13)]
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs}) > 1


def test_stop_string_ends_the_reply_before_it(client):
    full = _ask(client, temperature=0, max_tokens=6)["choices"][0]
    words = full["message"]["content"].split()
    assert len(words) >= 3, full
    stopped = _ask(client, temperature=0, max_tokens=6, stop=[words[2]])["choices"][0]
    assert stopped["finish_reason"] == "stop"
    assert stopped["message"]["content"] == full["message"]["content"][:full["message"]["content"].find(words[2])]
    assert full["token_ids"][:len(stopped["token_ids"])] == stopped["token_ids"]


def test_batched_greedy_equals_unbatched(engine):
    prompts = [engine.tokenizer.prompt_ids(QUESTION),
               engine.tokenizer.prompt_ids([{"role": "user", "content": "Name a colour of the rainbow, then explain."}]),
               engine.tokenizer.prompt_ids([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}])]
    jobs = [Job(prompt_ids=p, max_tokens=4, temperature=0.0) for p in prompts]
    alone = [engine.run_batch([job])[0].token_ids for job in jobs]
    together = [g.token_ids for g in engine.run_batch(jobs)]
    assert together == alone


def test_concurrent_requests_are_batched(engine):
    engine = LocalEngine(engine.model, engine.tokenizer, max_batch=8, batch_wait_s=1.0)
    jobs = [Job(prompt_ids=engine.tokenizer.prompt_ids(QUESTION), max_tokens=2, temperature=0.0) for _ in range(4)]

    async def run():
        try:
            return await asyncio.gather(*(engine.submit(job) for job in jobs))
        finally:
            await engine.aclose()

    results = asyncio.run(run())
    assert engine.peak_batch == 4
    assert len({tuple(r.token_ids) for r in results}) == 1


def test_rows_joining_a_running_batch_decode_as_alone(engine):
    """Continuous batching: a row admitted mid-flight (cache merged, left-padded) and rows leaving early."""
    from orchard.inference.local import Decoder, _generator, _Row

    short = Job(prompt_ids=engine.tokenizer.prompt_ids(QUESTION), max_tokens=2, temperature=0.0)
    long = Job(prompt_ids=engine.tokenizer.prompt_ids([{"role": "user", "content": "Tell me about the moon and tides."}]),
               max_tokens=5, temperature=0.0)
    late = Job(prompt_ids=engine.tokenizer.prompt_ids([{"role": "user", "content": "Hi"}]), max_tokens=3, temperature=0.0)
    alone = [engine.run_batch([job])[0].token_ids for job in (short, long, late)]
    decoder = Decoder(engine.model, engine.tokenizer, "cpu")
    rows = [_Row(job, _generator(None, "cpu")) for job in (short, long, late)]
    decoder.admit(rows[:2])
    decoder.step()
    decoder.admit(rows[2:])
    while decoder.rows:
        decoder.step()
    assert [row.ids for row in rows] == alone


def test_end_of_turn_is_kept_in_ids(client, engine):
    choice = _ask(client, temperature=0, max_tokens=16)["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["token_ids"][-1] == engine.tokenizer.end_of_turn_id
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert "<|im_end|>" not in choice["message"]["content"]


def test_sampler_rules():
    import torch

    logits = torch.tensor([0.0, 3.0, 1.0, 2.9])
    greedy = Job(prompt_ids=[], max_tokens=1, temperature=0.0, top_logprobs=2)
    token, logprob, top = sample(logits, greedy, torch.Generator().manual_seed(0))
    assert token == 1 and [t for t, _ in top] == [1, 3]
    assert math.isclose(logprob, float(torch.log_softmax(logits, -1)[1]))
    narrow = Job(prompt_ids=[], max_tokens=1, temperature=1.0, top_p=0.01)
    assert {sample(logits, narrow, torch.Generator().manual_seed(s))[0] for s in range(20)} == {1}
    wide = Job(prompt_ids=[], max_tokens=1, temperature=1.0)
    picks = [sample(logits, wide, torch.Generator().manual_seed(s))[0] for s in range(40)]
    assert picks == [sample(logits, wide, torch.Generator().manual_seed(s))[0] for s in range(40)]
    assert set(picks) >= {1, 3}


def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(engine):
    from orchard.errors import ModelError

    engine = LocalEngine(engine.model, engine.tokenizer, batch_wait_s=0.0)
    broken = Job(prompt_ids=[engine.tokenizer.vocab_size + 10], max_tokens=1, temperature=0.0)
    fine = Job(prompt_ids=engine.tokenizer.prompt_ids(QUESTION), max_tokens=1, temperature=0.0)

    async def run():
        try:
            with pytest.raises(ModelError, match="generation failed"):
                await engine.submit(broken)
            return await engine.submit(fine)
        finally:
            await engine.aclose()

    assert len(asyncio.run(run()).token_ids) == 1
