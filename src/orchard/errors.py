"""The one exception tree of Orchard, shared by the server, the SDK and every backend.

    OrchardError
    ├── RequestError            the caller's request is wrong (400/413/422)
    │   ├── PayloadTooLargeError    a body or file over a configured limit (413)
    │   └── SessionLimitError       a proxy session is past its call, token or time limit
    ├── AuthError               no key (401)
    │   └── ForbiddenError          a key the service does not know (403)
    ├── NotFoundError           unknown or deleted sandbox, job or file (404)
    │   └── SandboxNotFoundError
    ├── ConflictError           e.g. a duplicate sandbox id (409)
    ├── SandboxError            a sandbox cannot do what was asked
    │   ├── SandboxFailedError      it failed to start or died
    │   └── SandboxTimeoutError     it did not become ready in time (408)
    ├── BackendError            the backend (bubblewrap, Podman, Kubernetes) failed (500)
    ├── UpstreamError           the upstream model server failed or replied unusably (502)
    │   ├── UpstreamTimeoutError    it did not answer in time (504)
    │   └── UpstreamNoTokensError   it returned no token ids and the session is not text-only (400)
    ├── ModelError              a model server cannot load or run its model, or its script ran out (500)
    ├── HarnessError            a harness (Codex, Claude Code, ...) cannot be installed or launched
    ├── TaskError               a task file or task is malformed, or its image cannot be built
    ├── GraderError             a grader could not reach a verdict (infrastructure, never a model failure)
    ├── OverloadedError         transient overload, safe to retry (503, Retry-After)
    │   └── StoreUnavailableError   the shared state store (Redis) cannot be reached
    ├── ServerError             anything else the server reports (5xx)
    └── ServiceUnreachableError the SDK got no reply from the service after its retries (a ConnectionError)

Errors cross HTTP as ``{"detail": str, "error": ClassName}`` and the SDK re-raises
the same class. ``SandboxTimeoutError`` is also a ``TimeoutError``.
"""

from __future__ import annotations


class OrchardError(Exception):
    """Base of every Orchard error; ``detail`` is the human-readable message."""

    status_code = 500

    def __init__(self, detail: str = "", *, status_code: int | None = None, retry_after: float | None = None):
        super().__init__(detail)
        self.detail = detail
        if status_code is not None:
            self.status_code = status_code
        self.retry_after = retry_after


class RequestError(OrchardError):
    status_code = 400


class PayloadTooLargeError(RequestError):
    status_code = 413


class AuthError(OrchardError):
    status_code = 401


class ForbiddenError(AuthError):
    status_code = 403


class NotFoundError(OrchardError):
    status_code = 404


class SandboxNotFoundError(NotFoundError):
    pass


class ConflictError(OrchardError):
    status_code = 409


class SandboxError(OrchardError):
    status_code = 500


class SandboxFailedError(SandboxError):
    status_code = 500


class SandboxTimeoutError(SandboxError, TimeoutError):
    status_code = 408


class BackendError(OrchardError):
    status_code = 500


class SessionLimitError(RequestError):
    """A harness went past its proxy session's limit on calls, tokens or wall-clock; the session is over."""


class UpstreamError(OrchardError):
    """The upstream model server failed, timed out or replied unusably: an infrastructure failure."""

    status_code = 502


class UpstreamTimeoutError(UpstreamError, TimeoutError):
    status_code = 504


class UpstreamNoTokensError(UpstreamError):
    """The upstream returned no token ids; open the session in text-only mode to record text only.

    Answered with 400, not 502, so that a harness stops instead of retrying a call that cannot succeed."""

    status_code = 400


class ModelError(OrchardError):
    """A model server (local or scripted) cannot load or run its model, or its script has no reply left."""

    status_code = 500


class HarnessError(OrchardError):
    """A harness cannot be installed into the tools folder or launched in a sandbox (not a failed run: that is a result)."""

    status_code = 500


class TaskError(OrchardError):
    """A task file or task is malformed, its setup fails, or its image cannot be built (a wrong answer is a result)."""

    status_code = 422


class GraderError(OrchardError):
    """Grading could not produce a verdict (its sandbox, test runner or checker broke): the rollout is not scored."""

    status_code = 500


class OverloadedError(OrchardError):
    status_code = 503


class StoreUnavailableError(OverloadedError):
    """The service's state store cannot be reached; nothing was changed, retry shortly."""


class ServerError(OrchardError):
    status_code = 500


class ServiceUnreachableError(OrchardError, ConnectionError):
    """The SDK got no reply from the service (refused, reset, timed out) after its retries; ``__cause__`` is the transport error."""

    status_code = 503


_BY_NAME = {cls.__name__: cls for cls in (
    OrchardError, RequestError, PayloadTooLargeError, AuthError, ForbiddenError, NotFoundError,
    SandboxNotFoundError, ConflictError, SandboxError, SandboxFailedError, SandboxTimeoutError,
    BackendError, OverloadedError, StoreUnavailableError, ServerError,
    SessionLimitError, UpstreamError, UpstreamTimeoutError, UpstreamNoTokensError,
    ModelError, HarnessError, GraderError,
)}
_BY_STATUS = {400: RequestError, 401: AuthError, 403: ForbiddenError, 404: NotFoundError,
              408: SandboxTimeoutError, 409: ConflictError, 413: PayloadTooLargeError,
              422: RequestError, 503: OverloadedError}


def error_from_response(status_code: int, body: object, retry_after: float | None = None) -> OrchardError:
    """Rebuild the typed error a server reply describes (used by the SDK)."""
    detail, name = "", None
    if isinstance(body, dict):
        raw = body.get("detail", "")
        detail = raw if isinstance(raw, str) else _format_validation(raw)
        name = body.get("error")
    elif isinstance(body, str):
        detail = body
    cls = _BY_NAME.get(name or "") or _BY_STATUS.get(status_code) or (
        ServerError if status_code >= 500 else RequestError)
    return cls(detail or f"HTTP {status_code}", status_code=status_code, retry_after=retry_after)


def _format_validation(raw: object) -> str:
    if isinstance(raw, list):
        parts = []
        for item in raw:
            if isinstance(item, dict):
                loc = ".".join(str(x) for x in item.get("loc", []))
                parts.append(f"{loc}: {item.get('msg', '')}")
        return "; ".join(parts) or str(raw)
    return str(raw)
