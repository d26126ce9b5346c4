"""The viewer's web app: a static page plus a small JSON API over one run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse

from orchard.errors import NotFoundError, RequestError
from orchard.view.data import Decoder, RunData

STATIC = Path(__file__).parent / "static"


def create_app(run_dir: str | Path, decode: Optional[Decoder] = None) -> FastAPI:
    """The app serving one run: / (the page), /api/facets, /api/rollouts, /api/rollouts/{id}."""
    data = RunData(run_dir, decode)
    app = FastAPI(title="Orchard trajectory viewer", docs_url=None, redoc_url=None)

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/api/facets")
    def facets() -> dict:
        return {"run": str(data.dir), **data.facets()}

    @app.get("/api/rollouts")
    def rollouts(task: str = "", harness: str = "", reward: str = "", failure: str = "") -> list[dict]:
        try:
            return data.listing(task, harness, reward, failure)
        except RequestError as exc:
            raise HTTPException(400, exc.detail) from exc

    @app.get("/api/rollouts/{rollout_id:path}")
    def rollout(rollout_id: str) -> dict:
        try:
            return data.trajectory(rollout_id)
        except NotFoundError as exc:
            raise HTTPException(404, exc.detail) from exc

    return app
