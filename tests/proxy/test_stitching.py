"""Stitching: continuation, branches on rewritten history, ambiguous parents flagged, masks exactly on sampled tokens."""

from __future__ import annotations

from orchard.proxy.stitching import samples, stitch
from orchard.records import ModelCall


def mc(index: int, prompt: list[int], completion: list[int], **kw) -> ModelCall:
    return ModelCall(session_id="s", index=index, dialect="openai_chat", request={}, prompt_token_ids=prompt,
                     completion_token_ids=completion, logprobs=[-0.1 * (i + 1) for i in range(len(completion))],
                     finish_reason="stop", **kw)


def test_continuation_is_one_trajectory_with_exact_mask():
    calls = [mc(0, [1, 2], [3, 4]), mc(1, [1, 2, 3, 4, 5, 6], [7]), mc(2, [1, 2, 3, 4, 5, 6, 7, 8], [9, 10])]
    [t] = stitch(calls, reward=1.0)
    assert t.calls == [0, 1, 2] and t.input_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert t.loss_mask == [0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert t.logprobs == [0, 0, -0.1, -0.2, 0, 0, -0.1, 0, -0.1, -0.2]
    assert t.reward == 1.0 and not t.ambiguous and t.parent_branch is None


def test_rewritten_history_starts_a_branch_with_its_parent():
    calls = [mc(0, [1], [2]), mc(1, [1, 2, 3], [4]), mc(2, [1, 2, 9], [5])]  # call 2 drops call 1's turn
    first, second = stitch(calls)
    assert first.calls == [0, 1] and second.calls == [2]
    assert second.parent_branch == 0 and second.loss_mask == [0, 0, 0, 1] and not second.ambiguous


def test_compaction_starts_an_unrelated_branch():
    calls = [mc(0, [1, 2], [3]), mc(1, [8, 9], [4]), mc(2, [8, 9, 4, 5], [6])]
    first, second = stitch(calls)
    assert (first.calls, second.calls, second.parent_branch) == ([0], [1, 2], None)
    assert second.loss_mask == [0, 0, 1, 0, 1]


def test_identical_tips_are_ambiguous_not_guessed():
    calls = [mc(0, [1], [2]), mc(1, [1], [2]), mc(2, [1, 2, 3], [4])]  # two sub-agents sampled the same turn
    branches = stitch(calls)
    assert [b.calls for b in branches] == [[0], [1], [2]]
    assert branches[2].ambiguous and branches[2].candidate_parents == [0, 1]


def test_longest_matching_tip_wins():
    calls = [mc(0, [1], [2]), mc(1, [5], [6]), mc(2, [1, 2, 3], [4]), mc(3, [1, 2, 3, 4, 7], [8])]
    branches = stitch(calls)
    assert [b.calls for b in branches] == [[0, 2, 3], [1]]


def test_failed_and_text_only_calls_are_left_out():
    calls = [mc(0, [1], [2]), mc(1, [1, 2, 3], [], status="error", error="boom", infra_failure=True),
             mc(2, [], [], text_only=True)]
    assert [t.calls for t in stitch(calls)] == [[0]]
    assert [s.call_index for s in samples(calls)] == [0]


def test_samples_mask_only_completions():
    [s] = samples([mc(0, [1, 2, 3], [4, 5])], reward=0.5)
    assert s.input_ids == [1, 2, 3, 4, 5] and s.loss_mask == [0, 0, 0, 1, 1] and s.prompt_length == 3
    assert s.logprobs == [0, 0, 0, -0.1, -0.2] and s.reward == 0.5
