"""The records that flow from the harness proxy to the rollout engine and trainers: ModelCall, Sample, Trajectory."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Dialect = Literal["openai_chat", "openai_responses", "anthropic_messages"]
CallStatus = Literal["ok", "error"]


class CallTimings(BaseModel):
    """When a call happened and where its time went (seconds)."""

    model_config = ConfigDict(extra="forbid")

    started_at: float = 0.0
    """Unix time at which the proxy received the harness's request."""
    upstream_s: float = 0.0
    """Seconds spent waiting for the upstream model server."""
    total_s: float = 0.0
    """Seconds from receiving the request to having the reply ready (recording excluded)."""


class ModelCall(BaseModel):
    """One request a harness made to its model, as the proxy saw it and as the engine answered it."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    """The proxy session the call belongs to."""
    index: int
    """Position of the call within its session, from 0, in the order the proxy received them."""
    dialect: Dialect
    """The API the harness spoke: OpenAI Chat Completions, OpenAI Responses or Anthropic Messages."""
    request: dict[str, Any]
    """The harness's request body, exactly as received (never holds credentials: headers are not kept)."""
    upstream_request: Optional[dict[str, Any]] = None
    """The Chat Completions body the proxy sent upstream (None when the request was refused before that)."""
    reply: Optional[dict[str, Any]] = None
    """The upstream's raw reply body (None when the upstream failed)."""
    prompt_token_ids: list[int] = Field(default_factory=list)
    """The exact prompt the engine fed to the model (chat template applied), as the engine reported it."""
    completion_token_ids: list[int] = Field(default_factory=list)
    """The tokens the model sampled, as the engine reported them (end-of-turn token included if sampled)."""
    logprobs: list[float] = Field(default_factory=list)
    """Log-probability of each sampled token, aligned 1:1 with ``completion_token_ids``."""
    finish_reason: Optional[str] = None
    """Why sampling stopped: stop, length or tool_calls (None for failed calls)."""
    text_only: bool = False
    """True when the call carries no token ids: a text-only session in front of an upstream that returns none (a hosted API)."""
    status: CallStatus = "ok"
    """``ok`` when the harness got a model reply, ``error`` when it got an error."""
    error: Optional[str] = None
    """What went wrong, for failed calls."""
    infra_failure: bool = False
    """True when the failure was the infrastructure's (upstream down, timeout, bad upstream reply), never the model's."""
    timings: CallTimings = Field(default_factory=CallTimings)
    """Where the call's time went."""
    notes: list[str] = Field(default_factory=list)
    """What the translation to the upstream dropped (e.g. built-in tools a chat model cannot call)."""


class Sample(BaseModel):
    """One successful call as a training example: prompt tokens (mask 0) followed by sampled tokens (mask 1)."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    """The proxy session the call belongs to."""
    call_index: int
    """The call's index within its session."""
    dialect: Dialect
    """The API the harness spoke."""
    input_ids: list[int]
    """Prompt token ids followed by completion token ids."""
    loss_mask: list[int]
    """1 on every sampled (completion) token, 0 on every prompt token; same length as ``input_ids``."""
    logprobs: list[float]
    """Sampling log-probability at each position of ``input_ids`` (0.0 where ``loss_mask`` is 0)."""
    prompt_length: int
    """How many leading tokens of ``input_ids`` are the prompt."""
    finish_reason: Optional[str]
    """Why sampling stopped."""
    reward: Optional[float] = None
    """The session's reward, when one was attached."""


class Trajectory(BaseModel):
    """A chain of calls stitched by exact token-prefix matching into one token sequence."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    """The proxy session the calls belong to."""
    branch: int
    """Branch number within the session, from 0, in order of each branch's first call."""
    calls: list[int]
    """Indices of the calls in this branch, in order; each one's prompt extends the previous call's prompt + completion."""
    input_ids: list[int]
    """The last call's prompt followed by its completion: the whole conversation as the model saw and wrote it."""
    loss_mask: list[int]
    """1 exactly on tokens the model sampled in one of ``calls``, 0 on everything else (system, user, tool output, template)."""
    logprobs: list[float]
    """Sampling log-probability at each position (0.0 where ``loss_mask`` is 0)."""
    reward: Optional[float] = None
    """The session's reward, when one was attached."""
    parent_branch: Optional[int] = None
    """For a branch that forked from an earlier call that was not a branch tip (rewritten or compacted history): that call's branch."""
    ambiguous: bool = False
    """True when the first call could continue several branches equally well; the proxy starts a new branch rather than guess."""
    candidate_parents: list[int] = Field(default_factory=list)
    """For an ambiguous branch: the branches it could have continued."""
