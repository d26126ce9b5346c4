"""The Orchard Env wire contract: one pydantic model per request and reply, shared by server and SDK.

Field names, defaults and meanings follow ``shared/spec/env-api.md``. Request models ignore
unknown fields so that clients of the public Orchard Env API keep working unchanged.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

SANDBOX_ID_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
IMAGE_NAME_PATTERN = r"^[a-z0-9][a-z0-9._/-]{0,127}(:[A-Za-z0-9._-]{1,128})?$"

SandboxStatus = Literal["pending", "ready", "failed", "unschedulable", "not_found"]
JobStatus = Literal["queued", "running", "succeeded", "failed"]


def _clean_text(value: object) -> object:
    """Every string a caller sends must be valid UTF-8 without NUL bytes (paths, argv, env, patches)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("must not contain NUL bytes")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError("must be valid UTF-8 (no lone surrogates)") from e
    elif isinstance(value, (list, tuple)):
        for item in value:
            _clean_text(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _clean_text(key)
            _clean_text(item)
    return value


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @field_validator("*", mode="after")
    @classmethod
    def _text(cls, value: object) -> object:
        return _clean_text(value)


class Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


# ---------------------------------------------------------------- service
class RootInfo(Reply):
    service: str = Field("orchard-env", description="Service name.")
    version: str = Field(description="Service version.")
    status: str = Field("running", description="Always 'running' when the service answers.")


class Health(Reply):
    status: str = Field("healthy", description="'healthy' when the service answers.")


class ErrorBody(Reply):
    detail: Union[str, list] = Field(description="Human-readable message (a list for validation errors).")
    error: Optional[str] = Field(None, description="Name of the exception class in orchard.errors.")


# ---------------------------------------------------------------- sandboxes
class ModelEndpoint(Request):
    """One loopback port inside a closed sandbox that reaches one allow-listed host endpoint."""

    port: int = Field(ge=1, le=65535, description="Port on the sandbox's 127.0.0.1 to listen on.")
    target: str = Field(description="Host endpoint 'host:port'; must be in the server's allowlist.")


class CreateSandboxRequest(Request):
    image: str = Field(description="Image: 'host', an absolute root-filesystem directory, a snapshot or an OCI name.")
    block_network: bool = Field(True, description="No network but loopback when true.")
    sandbox_id: Optional[str] = Field(None, description="Caller-chosen id (a DNS label); generated when null.")
    cpu: Optional[str] = Field(None, description="CPU limit: '2', '0.5' or '500m'; server default when null.")
    memory: Optional[str] = Field(None, description="Memory limit: '512Mi', '2G' or bytes; server default when null.")
    timeout: Optional[int] = Field(None, gt=0, description="Readiness wait in seconds; server default when null.")
    disk: Optional[str] = Field(None, description="ext: size limit of the writable layer, e.g. '20Gi'; server default when null.")
    model_endpoint: Optional[ModelEndpoint] = Field(None, description="ext: forward one loopback port to a host endpoint.")
    ttl_seconds: Optional[int] = Field(None, gt=0, description="ext: lifetime in seconds (capped by the server's maximum).")

    @field_validator("sandbox_id")
    @classmethod
    def _dns_label(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not re.match(SANDBOX_ID_PATTERN, value):
            raise ValueError("sandbox_id must be a DNS label: lowercase letters, digits and '-', 1-63 characters")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        if not value or len(value) > 4096 or "\x00" in value or value.startswith("@"):
            raise ValueError("image must be a non-empty name or absolute path")
        return value


class CreateSandboxResponse(Reply):
    sandbox_id: str = Field(description="The sandbox's id.")
    namespace: str = Field(description="Backend namespace (the service's namespace name for the local backend).")
    image: str = Field(description="The image asked for.")
    block_network: bool = Field(description="Whether the network is blocked.")
    cpu: Optional[str] = Field(None, description="CPU limit as given, or the default applied.")
    memory: Optional[str] = Field(None, description="Memory limit as given, or the default applied.")
    timeout: Optional[int] = Field(None, description="Readiness wait in seconds.")
    status: SandboxStatus = Field(description="'pending' or 'ready' (or 'failed' if creation failed at once).")


class SandboxInfo(Reply):
    sandbox_id: str = Field(description="The sandbox's id.")
    namespace: str = Field(description="Backend namespace.")
    image: str = Field(description="The image asked for.")
    pod_name: Optional[str] = Field(None, description="Backend object name (pod, container or local sandbox).")
    block_network: bool = Field(True, description="Whether the network is blocked.")
    cpu: Optional[str] = Field(None, description="CPU limit.")
    memory: Optional[str] = Field(None, description="Memory limit.")
    created_at: float = Field(description="Creation time, epoch seconds.")
    ready: bool = Field(False, description="True when status is 'ready'.")
    status: SandboxStatus = Field(description="pending | ready | failed | unschedulable | not_found.")
    status_message: Optional[str] = Field(None, description="Why the sandbox is in its status (failures say why).")
    expires_at: Optional[float] = Field(None, description="ext: when the TTL deletes the sandbox, epoch seconds.")
    last_heartbeat: Optional[float] = Field(None, description="ext: last heartbeat, epoch seconds.")


class SandboxList(Reply):
    sandboxes: list[SandboxInfo] = Field(default_factory=list, description="The caller's sandboxes.")


class DeleteResponse(Reply):
    status: str = Field("deleted", description="Always 'deleted'.")
    sandbox_id: str = Field(description="The id asked for.")


class HeartbeatResponse(Reply):
    status: str = Field("ok", description="Always 'ok'.")
    sandbox_id: str = Field(description="The sandbox's id.")
    expires_at: Optional[float] = Field(None, description="ext: the TTL deadline after this heartbeat.")


class SnapshotRequest(Request):
    image: str = Field(description="Name of the new image, e.g. 'task-123:ready'.")

    @field_validator("image")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.match(IMAGE_NAME_PATTERN, value) or value == "host":
            raise ValueError("image must be a lowercase name like 'name' or 'name:tag' (not 'host')")
        return value


class SnapshotResponse(Reply):
    image: str = Field(description="The new image's name.")
    sandbox_id: str = Field(description="The sandbox it was taken from.")
    size: int = Field(0, description="Bytes added on top of the base image.")


# ---------------------------------------------------------------- exec and jobs
class ExecRequest(Request):
    command: Union[str, list[str]] = Field(description="A string runs under bash -c; a list is an argv run directly.")
    timeout_seconds: Optional[int] = Field(None, gt=0, description="Kill the command's process tree after this long.")
    cwd: Optional[str] = Field(None, description="Working directory inside the sandbox (default: its workdir).")
    env: Optional[dict[str, str]] = Field(None, description="Extra environment variables.")
    login_shell: bool = Field(False, description="Run a string command under a login shell.")
    wait: bool = Field(False, description="Hold the reply until the job ends (or the server-side wait runs out).")

    @field_validator("command")
    @classmethod
    def _non_empty_argv(cls, value: Union[str, list[str]]) -> Union[str, list[str]]:
        if isinstance(value, list) and (not value or not value[0]):
            raise ValueError("an argv command needs at least a program name")
        if any("\x00" in part for part in ([value] if isinstance(value, str) else value)):
            raise ValueError("command must not contain NUL bytes")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        for key, val in (value or {}).items():
            if not key or "=" in key or "\x00" in key or "\x00" in val:
                raise ValueError(f"invalid environment variable name or value: {key!r}")
        return value


class ExecQueued(Reply):
    job_id: str = Field(description="The job's id.")
    status: JobStatus = Field("queued", description="Always 'queued'.")


class Job(Reply):
    job_id: str = Field(description="The job's id.")
    sandbox_id: str = Field(description="The sandbox it runs in.")
    command: Union[str, list[str]] = Field(description="The command as submitted.")
    status: JobStatus = Field(description="queued | running | succeeded | failed.")
    stdout: str = Field("", description="Standard output (decoded as UTF-8, invalid bytes replaced).")
    stderr: str = Field("", description="Standard error.")
    exit_code: Optional[int] = Field(None, description="Exit code; 124 on timeout; null while not finished.")
    created_at: float = Field(description="Submission time.")
    started_at: Optional[float] = Field(None, description="When it started running.")
    completed_at: Optional[float] = Field(None, description="When it ended.")
    error: Optional[str] = Field(None, description="Infrastructure failure or timeout; null for a command's own exit.")
    stdout_truncated: bool = Field(False, description="ext: stdout hit the output cap.")
    stderr_truncated: bool = Field(False, description="ext: stderr hit the output cap.")


# ---------------------------------------------------------------- files
class UploadRequest(Request):
    path: str = Field(min_length=1, description="Destination path (relative paths resolve against the workdir).")
    content: str = Field(description="File content, base64.")
    mode: Optional[int] = Field(None, ge=0, le=0o7777, description="Permission bits, e.g. 0o755 (493).")


class UploadResponse(Reply):
    success: bool = Field(True, description="Always true on 200.")
    path: str = Field(description="The path written.")
    size: int = Field(description="Bytes written.")


class DownloadResponse(Reply):
    path: str = Field(description="The path read.")
    content: str = Field(description="File content, base64.")
    size: int = Field(description="Size in bytes.")


class FileEntry(Reply):
    name: str = Field(description="Entry name.")
    type: Literal["file", "directory", "symlink"] = Field(description="Entry kind (symlinks are not followed).")
    size: int = Field(description="Size in bytes (of the link itself for symlinks).")
    modified: str = Field(description="Modification time, ISO-8601.")


class ListFilesResponse(Reply):
    path: str = Field(description="The directory listed.")
    files: list[FileEntry] = Field(default_factory=list, description="Entries sorted by name.")


class ApplyPatchRequest(Request):
    patch: str = Field(description="Unified diff text.")
    timeout_seconds: int = Field(30, gt=0, description="Timeout for git apply.")
    cwd: Optional[str] = Field(None, description="Directory to apply in (default: the sandbox workdir).")


class ApplyPatchResponse(Reply):
    success: bool = Field(description="True when git apply exited 0.")
    stdout: str = Field("", description="git's standard output.")
    stderr: str = Field("", description="git's standard error.")
    exit_code: Optional[int] = Field(None, description="git's exit code.")
    error: Optional[str] = Field(None, description="Infrastructure failure or timeout.")


# ---------------------------------------------------------------- resources
class Capacity(Reply):
    cpu: float = Field(0.0, description="CPU cores.")
    memory_bytes: int = Field(0, description="Memory in bytes.")


class SandboxUsage(Reply):
    sandbox_id: str = Field(description="The sandbox.")
    cpu: float = Field(0.0, description="CPU cores requested.")
    memory_bytes: int = Field(0, description="Memory requested.")
    memory_used_bytes: Optional[int] = Field(None, description="Memory in use now, when the backend knows.")


class ResourcesResponse(Reply):
    status: str = Field("ok", description="Always 'ok'.")
    total_capacity: Capacity = Field(description="What the machine(s) have.")
    total_allocatable: Capacity = Field(description="What sandboxes may use.")
    total_requested: Capacity = Field(description="Sum of live sandboxes' limits.")
    available: Capacity = Field(description="Allocatable minus requested.")
    sandbox_count: int = Field(0, description="Live sandboxes.")
    sandboxes: Optional[list[SandboxUsage]] = Field(None, description="Per-sandbox rows (admin keys only).")


# ---------------------------------------------------------------- PTY frames
class PtyInit(Request):
    type: Literal["init"] = "init"
    cmd: list[str] = Field(default_factory=lambda: ["bash"], min_length=1, description="argv to run on the terminal.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment.")
    cwd: Optional[str] = Field(None, description="Working directory (default: the sandbox workdir).")
    rows: int = Field(24, ge=1, le=1000, description="Terminal rows.")
    cols: int = Field(80, ge=1, le=1000, description="Terminal columns.")
    login_shell: bool = Field(False, description="Wrap cmd in a login shell.")


class PtyStdin(Request):
    type: Literal["stdin"] = "stdin"
    data: str = Field(description="base64 bytes to write to the terminal.")


class PtyResize(Request):
    type: Literal["resize"] = "resize"
    rows: int = Field(ge=1, le=1000)
    cols: int = Field(ge=1, le=1000)


class PtySignal(Request):
    type: Literal["signal"] = "signal"
    sig: Literal["INT", "TERM", "KILL", "HUP", "QUIT"]


class PtyClose(Request):
    type: Literal["close"] = "close"


PtyClientFrame = Annotated[Union[PtyInit, PtyStdin, PtyResize, PtySignal, PtyClose], Field(discriminator="type")]


class PtyReady(Reply):
    type: Literal["ready"] = "ready"
    pid: int


class PtyStdout(Reply):
    type: Literal["stdout"] = "stdout"
    data: str


class PtyExit(Reply):
    type: Literal["exit"] = "exit"
    code: int


class PtyError(Reply):
    type: Literal["error"] = "error"
    message: str


PtyServerFrame = Annotated[Union[PtyReady, PtyStdout, PtyExit, PtyError], Field(discriminator="type")]
