"""The Orchard Env SDK: blocking and asyncio clients of the sandbox service."""

from orchard.client.aio import AsyncSandboxClient, AsyncSandboxInstance
from orchard.client.pty import AsyncPtyProcess, PtyProcess
from orchard.client.results import JobResult
from orchard.client.sync import SandboxClient, SandboxInstance

__all__ = [
    "AsyncPtyProcess",
    "AsyncSandboxClient",
    "AsyncSandboxInstance",
    "JobResult",
    "PtyProcess",
    "SandboxClient",
    "SandboxInstance",
]
