"""The result of one command run in a sandbox, as the SDK hands it to callers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from orchard.env.protocol import Job


@dataclass(frozen=True)
class JobResult:
    """A job's status and output; ``is_complete`` is false while it is queued or running."""

    job_id: str
    status: str
    stdout: str = ""
    stderr: str = ""
    exit_code: Optional[int] = None
    error: Optional[str] = None
    created_at: Optional[float] = None
    started_at: Optional[float] = None
    completed_at: Optional[float] = None
    sandbox_id: Optional[str] = None
    command: Union[str, list[str], None] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @classmethod
    def from_job(cls, job: Job) -> "JobResult":
        """Build a result from the wire model ``protocol.Job``."""
        return cls(**{name: getattr(job, name) for name in cls.__dataclass_fields__})

    @property
    def succeeded(self) -> bool:
        """True when the command exited with code 0."""
        return self.exit_code == 0

    @property
    def failed(self) -> bool:
        """True when the job ended in status ``failed`` (non-zero exit, timeout or infrastructure error)."""
        return self.status == "failed"

    @property
    def is_complete(self) -> bool:
        """True once the job has ended; a ``running`` or ``queued`` job is never complete."""
        return self.status in ("succeeded", "failed")
