"""Proxy sessions: who may call (keys), what they may spend (limits), and what they did (call summaries, reward)."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from orchard.errors import AuthError, ForbiddenError, NotFoundError, SessionLimitError

Status = Literal["open", "limit_reached", "refused", "closed"]


class SessionOptions(BaseModel):
    """The body of ``POST /sessions``: what the session may do."""

    model_config = ConfigDict(extra="forbid")

    text_only: bool = False
    """Record text only: accept an upstream that returns no token ids (distilling from a hosted API)."""
    max_calls: Optional[int] = Field(default=None, ge=1)
    """Most model calls the harness may make."""
    max_tokens: Optional[int] = Field(default=None, ge=1)
    """Most tokens the model may sample over the whole session (each call's max_tokens is capped to what is left)."""
    max_seconds: Optional[float] = Field(default=None, gt=0)
    """Wall-clock limit, counted from the session's creation."""
    model: Optional[str] = None
    """The model name sent upstream (default: the proxy's --model, else whatever the harness asks for)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Anything the caller wants kept with the session (task id, sample number, harness)."""


class RewardBody(BaseModel):
    """The body of ``POST /sessions/{id}/reward``."""

    model_config = ConfigDict(extra="forbid")

    reward: float
    """The session's reward; a later reward replaces an earlier one."""
    info: dict[str, Any] = Field(default_factory=dict)
    """How it was computed (tests passed, judge notes)."""


@dataclass
class Session:
    """One harness run's state in the proxy."""

    id: str
    key_hash: str
    options: SessionOptions
    created_at: float
    status: Status = "open"
    reason: Optional[str] = None
    reward: Optional[float] = None
    reward_info: dict[str, Any] = field(default_factory=dict)
    next_index: int = 0
    tokens_sampled: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    limit_recorded: bool = False

    def admit(self) -> tuple[int, Optional[int]]:
        """Take the next call index and the most tokens this call may sample; refuse past a limit."""
        if self.status != "open":
            raise SessionLimitError(f"session {self.id} is {self.status}" + (f": {self.reason}" if self.reason else ""))
        self._check_limits()
        index, self.next_index = self.next_index, self.next_index + 1
        left = None if self.options.max_tokens is None else self.options.max_tokens - self.tokens_sampled
        return index, left

    def _check_limits(self) -> None:
        o = self.options
        if o.max_calls is not None and self.next_index >= o.max_calls:
            self._stop(f"call limit reached ({o.max_calls} calls)")
        if o.max_tokens is not None and self.tokens_sampled >= o.max_tokens:
            self._stop(f"token limit reached ({self.tokens_sampled} of {o.max_tokens} sampled tokens)")
        if o.max_seconds is not None and time.time() - self.created_at > o.max_seconds:
            self._stop(f"wall-clock limit reached ({o.max_seconds:g} s)")

    def _stop(self, reason: str) -> None:
        self.status, self.reason = "limit_reached", reason
        raise SessionLimitError(f"session {self.id}: {reason}; the session is over")

    def note_call(self, record: dict[str, Any], prompt_tokens: int, sampled: int) -> None:
        """Keep a call's summary and count the tokens the model sampled in it."""
        self.tokens_sampled += sampled
        self.calls.append({k: record.get(k) for k in ("index", "dialect", "status", "finish_reason", "error", "infra_failure")}
                          | {"prompt_tokens": prompt_tokens, "completion_tokens": sampled})
        self.next_index = max(self.next_index, record.get("index", 0) + 1)

    def view(self) -> dict[str, Any]:
        """What ``GET /sessions/{id}`` shows."""
        return {"id": self.id, "status": self.status, "reason": self.reason, "created_at": self.created_at,
                "options": self.options.model_dump(), "reward": self.reward, "reward_info": self.reward_info,
                "tokens_sampled": self.tokens_sampled, "calls": sorted(self.calls, key=lambda c: c["index"])}


def hash_key(key: str) -> str:
    """Keys are kept hashed: the store never holds a usable key."""
    return hashlib.sha256(key.encode()).hexdigest()


class Sessions:
    """Every session, found by id or by key; rebuilt from the recorder's files after a restart."""

    def __init__(self) -> None:
        self.by_id: dict[str, Session] = {}
        self.by_key: dict[str, Session] = {}

    def create(self, options: SessionOptions) -> tuple[Session, str]:
        key = "sk-orchard-" + secrets.token_urlsafe(24)
        session = Session(id="s_" + secrets.token_hex(8), key_hash=hash_key(key), options=options, created_at=time.time())
        self._add(session)
        return session, key

    def _add(self, session: Session) -> None:
        self.by_id[session.id] = session
        self.by_key[session.key_hash] = session

    def get(self, session_id: str) -> Session:
        session = self.by_id.get(session_id)
        if session is None:
            raise NotFoundError(f"no session {session_id!r}")
        return session

    def authenticate(self, key: Optional[str], path_session: Optional[str]) -> Session:
        """The session a harness's key names; with a ``/sessions/{id}`` prefix the key must be that session's."""
        if not key:
            raise AuthError("no API key: send the session key as 'Authorization: Bearer <key>' or 'x-api-key'")
        session = self.by_key.get(hash_key(key))
        if session is None or (path_session is not None and session.id != path_session):
            raise ForbiddenError("unknown API key: this proxy answers only the sessions it opened")
        return session

    def event(self, session: Session, kind: str, **fields: Any) -> dict[str, Any]:
        """The record of a session event, as sessions.jsonl keeps it."""
        base = {"event": kind, "id": session.id, "at": time.time()}
        if kind == "created":
            base |= {"key_hash": session.key_hash, "options": session.options.model_dump(), "created_at": session.created_at}
        return base | fields

    def replay(self, events: list[dict[str, Any]], calls: Any) -> None:
        """Rebuild sessions from their events and recorded calls (after a restart)."""
        for e in events:
            self._apply(e)
        for record in calls:
            session = self.by_id.get(record.get("session_id", ""))
            if session is not None:
                usage = (record.get("reply") or {}).get("usage") or {}
                session.note_call(record, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))

    def _apply(self, e: dict[str, Any]) -> None:
        if e.get("event") == "created":
            self._add(Session(id=e["id"], key_hash=e["key_hash"], options=SessionOptions(**e["options"]),
                              created_at=e["created_at"]))
            return
        session = self.by_id.get(e.get("id", ""))
        if session is None:
            return
        if e["event"] == "reward":
            session.reward, session.reward_info = e["reward"], e.get("info", {})
        elif e["event"] == "status":
            session.status, session.reason = e["status"], e.get("reason")
            session.limit_recorded = session.status == "limit_reached"

