"""Stitch a session's calls into trajectories by exact token-prefix matching, and cut per-call samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from orchard.records import ModelCall, Sample, Trajectory


@dataclass
class _Branch:
    number: int
    calls: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    parent: Optional[int] = None
    candidates: list[int] = field(default_factory=list)

    def extend(self, call: ModelCall) -> None:
        """Append what came between the tip and this call's prompt (mask 0), then what the model sampled (mask 1)."""
        between = len(call.prompt_token_ids) - len(self.tokens)
        self.tokens = list(call.prompt_token_ids) + list(call.completion_token_ids)
        self.mask += [0] * between + [1] * len(call.completion_token_ids)
        self.logprobs += [0.0] * between + list(call.logprobs)
        self.calls.append(call.index)


def trainable(calls: Iterable[ModelCall]) -> list[ModelCall]:
    """Calls that reached the model and carry the engine's tokens, in call order."""
    return sorted((c for c in calls if c.status == "ok" and c.completion_token_ids and not c.text_only),
                  key=lambda c: c.index)


def _starts_with(sequence: list[int], prefix: list[int]) -> bool:
    return len(prefix) <= len(sequence) and sequence[:len(prefix)] == prefix


def stitch(calls: Iterable[ModelCall], reward: Optional[float] = None) -> list[Trajectory]:
    """One trajectory per branch.

    A call continues the branch whose tip (last prompt + completion) its prompt starts with, the longest such
    tip when several match. Two equally long matching tips are ambiguous: the call starts a new branch flagged
    with both candidates, rather than a guess. A call that continues no tip (compaction, rewritten history, a
    retried turn, a sub-agent) starts a new branch; when its prompt starts with some earlier call's prompt +
    completion, that call's branch is its ``parent_branch``.
    """
    branches: list[_Branch] = []
    owner: dict[int, int] = {}
    done: list[ModelCall] = []
    for call in trainable(calls):
        branch = _place(call, branches, done, owner)
        branch.extend(call)
        owner[call.index] = branch.number
        done.append(call)
    return [_trajectory(b, calls_session(done), reward) for b in branches]


def _place(call: ModelCall, branches: list[_Branch], done: list[ModelCall], owner: dict[int, int]) -> _Branch:
    prompt = call.prompt_token_ids
    tips = [b for b in branches if _starts_with(prompt, b.tokens)]
    longest = max((len(b.tokens) for b in tips), default=-1)
    best = [b for b in tips if len(b.tokens) == longest]
    if len(best) == 1:
        return best[0]
    branch = _Branch(number=len(branches), candidates=[b.number for b in best] if best else [])
    if not best:
        branch.parent = _fork_point(prompt, done, owner)
    branches.append(branch)
    return branch


def _fork_point(prompt: list[int], done: list[ModelCall], owner: dict[int, int]) -> Optional[int]:
    """The branch of the latest, longest earlier call whose prompt + completion begins this prompt."""
    best, best_length = None, 0
    for call in done:
        full = call.prompt_token_ids + call.completion_token_ids
        if len(full) >= best_length and _starts_with(prompt, full):
            best, best_length = owner[call.index], len(full)
    return best


def calls_session(calls: list[ModelCall]) -> str:
    return calls[0].session_id if calls else ""


def _trajectory(branch: _Branch, session_id: str, reward: Optional[float]) -> Trajectory:
    return Trajectory(session_id=session_id, branch=branch.number, calls=branch.calls, input_ids=branch.tokens,
                      loss_mask=branch.mask, logprobs=branch.logprobs, reward=reward, parent_branch=branch.parent,
                      ambiguous=len(branch.candidates) > 1, candidate_parents=branch.candidates)


def samples(calls: Iterable[ModelCall], reward: Optional[float] = None) -> list[Sample]:
    """Every trainable call on its own: prompt (mask 0) then completion (mask 1)."""
    return [Sample(session_id=c.session_id, call_index=c.index, dialect=c.dialect,
                   input_ids=c.prompt_token_ids + c.completion_token_ids,
                   loss_mask=[0] * len(c.prompt_token_ids) + [1] * len(c.completion_token_ids),
                   logprobs=[0.0] * len(c.prompt_token_ids) + list(c.logprobs), prompt_length=len(c.prompt_token_ids),
                   finish_reason=c.finish_reason, reward=reward) for c in trainable(calls)]
