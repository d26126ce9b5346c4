"""The small interfaces the engine runs against: a task, a harness runner and the proxy gateway."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from orchard.records import ModelCall, Trajectory


@dataclass
class Grade:
    """The grader's verdict on a rollout's final state."""

    reward: float
    """1.0 when resolved, else 0.0 (or a task-defined score)."""
    resolved: bool
    """True when the task's tests or checker passed."""
    detail: str = ""
    """A short summary (tests failed and passed, checker output tail)."""


@dataclass
class HarnessOutcome:
    """How a harness run ended, as far as the engine needs to know."""

    stop_reason: str
    """submitted | budget | error | ... (the harness's own words)."""
    exit_code: Optional[int] = None
    detail: str = ""
    infra: bool = False
    """True when the harness could not run at all (not installed, crashed on start): an infrastructure failure."""


@dataclass
class Session:
    """A proxy session: the harness reaches its model through it."""

    session_id: str
    key: str
    base_url: str
    """Host-side OpenAI-compatible base URL of the session (ends in /v1)."""
    urls: dict[str, str] = field(default_factory=dict)
    """Host-side base URL per dialect."""


@dataclass
class SessionRecord:
    """What the proxy recorded in a session."""

    calls: list[ModelCall]
    trajectories: list[Trajectory]


class RolloutTask(Protocol):
    """A task as the engine sees it; adapters wrap the task model's tasks.

    It may also have ``async prepare(client)``: called once per distinct image before a run, to build it.
    """

    task_id: str
    group: str
    image: str
    instruction: str
    workdir: str

    async def create(self, client: Any, **kwargs: Any) -> Any:
        """A fresh sandbox from the task's image (``kwargs`` go to ``create_sandbox``)."""

    async def setup(self, sandbox: Any) -> None:
        """Prepare a fresh sandbox made from ``image`` (raise on infrastructure trouble)."""

    async def grade(self, client: Any, sandbox: Any, patch: str) -> Grade:
        """Score the final state (``sandbox``, still alive) or ``patch`` (in a fresh sandbox made with ``client``)."""


class HarnessRunner(Protocol):
    """Runs one harness inside a sandbox against one proxy session."""

    name: str

    async def run(self, sandbox: Any, session: Session, model_url: str, task: RolloutTask) -> HarnessOutcome:
        """Run to the end; ``model_url`` is the session's OpenAI base URL as seen from inside the sandbox."""


class Gateway(Protocol):
    """The recording proxy, as the engine uses it."""

    upstream: str
    target: str
    """host:port of the proxy, for the sandbox's model-endpoint forward."""

    async def open(self, name: str) -> Session: ...

    async def record(self, session: Session) -> SessionRecord: ...

    async def reward(self, session: Session, reward: float) -> None: ...
