"""API-key authentication: X-API-Key header (or api_key for WebSockets), compared in constant time."""

from __future__ import annotations

import hmac
from typing import Optional

from fastapi import Request

from orchard import errors
from orchard.env.service.callers import ANONYMOUS, Caller, owner_of
from orchard.env.settings import Settings

MISSING = "Missing API key. Please provide X-API-Key header."


def authenticate(settings: Settings, key: Optional[str]) -> Caller:
    """The caller a key names; 401 without a key, 403 for an unknown one."""
    if not settings.auth_enabled():
        return ANONYMOUS
    if not key:
        raise errors.AuthError(MISSING)
    admin = _known(key, settings.admin_keys)
    if not admin and not _known(key, settings.api_keys):
        raise errors.ForbiddenError("Invalid API key")
    return Caller(owner=owner_of(key), admin=admin)


def _known(key: str, keys: list[str]) -> bool:
    found = False
    for candidate in keys:      # no early exit: constant time over the key list
        found |= hmac.compare_digest(key.encode(), candidate.encode())
    return found


async def caller(request: Request) -> Caller:
    """FastAPI dependency: the authenticated caller of an HTTP request."""
    return authenticate(request.app.state.core.settings, request.headers.get("x-api-key"))
