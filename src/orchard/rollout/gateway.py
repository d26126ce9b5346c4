"""The engine's client of the recording proxy: open a session, read what it recorded, attach the reward."""

from __future__ import annotations

from typing import Any, Optional
from urllib.parse import urlsplit

import httpx

from orchard.errors import error_from_response
from orchard.proxy.stitching import stitch
from orchard.records import ModelCall
from orchard.rollout.parts import Session, SessionRecord


class ProxyGateway:
    """Talks to `orchard proxy serve` over HTTP with its admin key (or none on a loopback --no-auth proxy)."""

    def __init__(self, url: str, upstream: str, admin_key: Optional[str] = None, timeout: float = 120.0,
                 session_options: Optional[dict[str, Any]] = None):
        self.url, self.upstream = url.rstrip("/"), upstream
        parts = urlsplit(self.url)
        self.target = f"{parts.hostname}:{parts.port or 80}"
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout,
                                       limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        self.session_options = session_options or {}

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        reply = await self._http.request(method, path, **kwargs)
        if reply.status_code >= 400:
            try:
                body: Any = reply.json()
            except ValueError:
                body = reply.text
            raise error_from_response(reply.status_code, body)
        return reply.json()

    async def open(self, name: str) -> Session:
        body = {**self.session_options, "metadata": {"rollout": name}}
        data = await self._call("POST", "/sessions", json=body)
        urls = data["base_urls"]
        return Session(session_id=data["id"], key=data["key"], base_url=urls["openai_chat"], urls=urls)

    async def record(self, session: Session) -> SessionRecord:
        """The session's calls, stitched here (the proxy's own stitching, without a second round trip)."""
        calls = [ModelCall.model_validate(c) for c in await self._call("GET", f"/sessions/{session.session_id}/calls")]
        return SessionRecord(calls=calls, trajectories=stitch(calls, None))

    async def reward(self, session: Session, reward: float) -> None:
        await self._call("POST", f"/sessions/{session.session_id}/reward", json={"reward": reward})
        await self._call("POST", f"/sessions/{session.session_id}/close")

    async def aclose(self) -> None:
        await self._http.aclose()
