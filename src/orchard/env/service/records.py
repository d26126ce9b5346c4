"""What the service remembers about sandboxes and jobs (stored records, not wire models)."""

from __future__ import annotations

from typing import Optional, Union

from pydantic import BaseModel, ConfigDict

from orchard.env.protocol import Job, JobStatus, SandboxInfo, SandboxStatus


class SandboxRecord(BaseModel):
    """One sandbox as the store keeps it."""

    model_config = ConfigDict(extra="ignore")

    sandbox_id: str
    owner: str                       # hash of the creating key ("" without auth)
    namespace: str
    image: str
    backend_image: Optional[str] = None   # what the backend resolves (a caller's snapshot is owner-qualified)
    block_network: bool = True
    cpu: Optional[str] = None
    memory: Optional[str] = None
    timeout: int = 600
    status: SandboxStatus = "pending"
    status_message: Optional[str] = None
    created_at: float
    ready_at: Optional[float] = None
    expires_at: float
    ttl_seconds: int = 7200          # how far a heartbeat pushes expires_at
    last_heartbeat: Optional[float] = None
    model_endpoint: Optional[tuple[int, str]] = None   # (sandbox port, "host:port")
    replica: Optional[str] = None    # the replica that started it (a shared store has several)

    def info(self) -> SandboxInfo:
        """The wire view of this record."""
        return SandboxInfo(
            sandbox_id=self.sandbox_id, namespace=self.namespace, image=self.image,
            pod_name=f"sandbox-{self.sandbox_id}", block_network=self.block_network, cpu=self.cpu,
            memory=self.memory, created_at=self.created_at, ready=self.status == "ready",
            status=self.status, status_message=self.status_message, expires_at=self.expires_at,
            last_heartbeat=self.last_heartbeat)


class JobRecord(BaseModel):
    """One exec job as the store keeps it."""

    model_config = ConfigDict(extra="ignore")

    job_id: str
    sandbox_id: str
    owner: str
    command: Union[str, list[str]]
    status: JobStatus = "queued"
    stdout: str = ""
    stderr: str = ""
    exit_code: Optional[int] = None
    created_at: float
    started_at: Optional[float] = None
    completed_at: Optional[float] = None
    error: Optional[str] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    idempotency_key: Optional[str] = None
    replica: Optional[str] = None    # the replica that runs it: its death fails the job

    @property
    def finished(self) -> bool:
        return self.status in ("succeeded", "failed")

    def wire(self) -> Job:
        """The wire view of this record."""
        return Job.model_validate(self.model_dump(exclude={"owner", "idempotency_key", "replica"}))
