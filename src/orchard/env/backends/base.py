"""The backend protocol: put a sandbox somewhere, run things in it, take it away.

The service holds no backend-specific logic; every backend implements ``Backend`` and
passes the same contract suite (tests/env/contract). Paths given to file methods are
already absolute paths inside the sandbox; the backend must resolve them inside the
sandbox's own view (never on the host).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional, Protocol

from orchard.env.protocol import FileEntry

TOOLS_MOUNT = "/opt/orchard/tools"        # where settings.tools_dir appears, read-only, in every sandbox


@dataclass
class SandboxSpec:
    """What to create: the service has validated and defaulted every field."""

    sandbox_id: str
    image: str
    block_network: bool = True
    cpu: Optional[float] = None           # cores
    memory: Optional[int] = None          # bytes
    pids: Optional[int] = None            # max processes
    disk: Optional[int] = None            # bytes of writable layer (best effort)
    model_endpoint: Optional[tuple[int, str, int]] = None  # (sandbox port, host, host port)
    created_at: float = 0.0


@dataclass
class ExecSpec:
    """One command to run in a sandbox."""

    argv: list[str]
    cwd: Optional[str] = None             # None: the sandbox workdir
    env: dict[str, str] = field(default_factory=dict)
    timeout: float = 300.0
    output_limit: int = 16 * 1024 * 1024  # bytes kept per stream


@dataclass
class ExecOutcome:
    """How a command ended. ``error`` is set only for timeouts and infrastructure failures."""

    exit_code: Optional[int]
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    error: Optional[str] = None
    started_at: Optional[float] = None


class PtyProcess(Protocol):
    """A command running on a pseudo-terminal inside a sandbox."""

    pid: int                                   # pid as seen inside the sandbox (host pid if unknown)
    master_fd: int                             # read/write end of the terminal

    def resize(self, rows: int, cols: int) -> None: ...
    def signal(self, sig: int) -> None: ...
    async def wait(self) -> int: ...           # exit code; negative -N when killed by signal N
    async def kill(self) -> None: ...          # kill the whole process tree and reap it


@dataclass
class LiveSandbox:
    """A sandbox the backend found running (for reconciliation)."""

    sandbox_id: str
    created_at: float
    alive: bool = True


ExitCallback = Callable[[str, str], Awaitable[None]]   # (sandbox_id, message) when a sandbox dies by itself


class Backend(Protocol):
    name: str
    namespace: str

    async def start(self, on_exit: ExitCallback) -> None:
        """Prepare (images, cgroups, helpers); remember ``on_exit`` to report sandboxes that die."""

    async def close(self) -> None:
        """Release service-side resources; sandboxes keep running."""

    async def create(self, spec: SandboxSpec) -> None:
        """Start the sandbox and return when it is ready; raise SandboxFailedError (with why) if it cannot."""

    async def adopt(self, spec: SandboxSpec) -> bool:
        """After a service restart: re-attach to a running sandbox; False if it is gone."""

    async def delete(self, sandbox_id: str) -> None:
        """Kill everything of the sandbox and remove what it left (idempotent)."""

    async def list_live(self) -> Optional[list[LiveSandbox]]:
        """Every sandbox the backend holds, records or not; None if it cannot tell (skip reconcile)."""

    async def exec(self, sandbox_id: str, spec: ExecSpec) -> ExecOutcome:
        """Run one command; on timeout kill only its process tree (exit 124)."""

    async def open_pty(self, sandbox_id: str, argv: list[str], cwd: Optional[str], env: dict[str, str],
                       rows: int, cols: int) -> PtyProcess:
        """Start argv on a new terminal inside the sandbox."""

    async def read_file(self, sandbox_id: str, path: str, limit: int) -> bytes: ...
    async def write_file(self, sandbox_id: str, path: str, data: bytes, mode: Optional[int]) -> None: ...
    async def list_dir(self, sandbox_id: str, path: str) -> list[FileEntry]: ...

    async def snapshot(self, sandbox_id: str, image: str) -> int:
        """Freeze the sandbox's filesystem into a named image; return bytes added."""

    async def workdir(self, sandbox_id: str) -> str:
        """Default working directory of the sandbox (a backend may have to ask the sandbox first)."""

    def images(self) -> list[str]:
        """Image names this backend can start (for error messages)."""

    def capacity(self) -> tuple[float, int]:
        """(cpu cores, memory bytes) of what sandboxes may use."""

    def memory_used(self, sandbox_id: str) -> Optional[int]:
        """Bytes the sandbox uses now, if known."""
