"""Orchard: sandboxes for training and evaluating LLM agents; the top level is the light SDK (httpx, pydantic)."""

from orchard.client import (
    AsyncSandboxClient,
    AsyncSandboxInstance,
    JobResult,
    SandboxClient,
    SandboxInstance,
)
from orchard.errors import (
    AuthError,
    BackendError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    OrchardError,
    OverloadedError,
    PayloadTooLargeError,
    RequestError,
    SandboxError,
    SandboxFailedError,
    SandboxNotFoundError,
    SandboxTimeoutError,
    ServerError,
    StoreUnavailableError,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncSandboxClient",
    "AsyncSandboxInstance",
    "AuthError",
    "BackendError",
    "ConflictError",
    "ForbiddenError",
    "JobResult",
    "NotFoundError",
    "OrchardError",
    "OverloadedError",
    "PayloadTooLargeError",
    "RequestError",
    "SandboxClient",
    "SandboxError",
    "SandboxFailedError",
    "SandboxInstance",
    "SandboxNotFoundError",
    "SandboxTimeoutError",
    "ServerError",
    "StoreUnavailableError",
]
