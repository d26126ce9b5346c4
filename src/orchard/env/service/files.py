"""File transfer and apply_patch inside a sandbox, with paths resolved against its workdir."""

from __future__ import annotations

import base64
import binascii
import posixpath
import uuid
from typing import Optional

from orchard import errors
from orchard.env.backends.base import Backend, ExecSpec
from orchard.env.protocol import (ApplyPatchRequest, ApplyPatchResponse, DownloadResponse, ListFilesResponse,
                                  UploadRequest, UploadResponse)
from orchard.env.settings import Settings

_APPLY = 'git apply --verbose "$1"; rc=$?; rm -f -- "$1"; exit $rc'


class FileOps:
    """Upload, download, list and patch through the backend."""

    def __init__(self, settings: Settings, backend: Backend):
        self.settings, self.backend = settings, backend

    async def resolve(self, sandbox_id: str, path: str, cwd: Optional[str] = None) -> str:
        """Absolute, normalised path inside the sandbox (the backend still resolves links inside its root)."""
        if not path or "\x00" in path:
            raise errors.RequestError("path must be a non-empty string without NUL bytes", status_code=400)
        base = cwd or await self.backend.workdir(sandbox_id)
        return posixpath.normpath(posixpath.join(base, path))

    async def upload(self, sandbox_id: str, req: UploadRequest) -> UploadResponse:
        """Decode and write one file, creating parents."""
        limit = self.settings.max_file_bytes
        if len(req.content) > (limit * 4) // 3 + 8:
            raise errors.PayloadTooLargeError(f"File exceeds the {limit}-byte limit")
        try:
            data = base64.b64decode(req.content, validate=True)
        except (binascii.Error, ValueError) as e:
            raise errors.RequestError(f"content is not valid base64: {e}", status_code=400) from e
        if len(data) > limit:
            raise errors.PayloadTooLargeError(f"File of {len(data)} bytes exceeds the {limit}-byte limit")
        path = await self.resolve(sandbox_id, req.path)
        await self.backend.write_file(sandbox_id, path, data, req.mode)
        return UploadResponse(success=True, path=path, size=len(data))

    async def download(self, sandbox_id: str, path: str) -> DownloadResponse:
        """Read one file as base64."""
        path = await self.resolve(sandbox_id, path)
        data = await self.backend.read_file(sandbox_id, path, self.settings.max_file_bytes)
        return DownloadResponse(path=path, content=base64.b64encode(data).decode(), size=len(data))

    async def list(self, sandbox_id: str, path: str) -> ListFilesResponse:
        """List one directory, sorted by name."""
        path = await self.resolve(sandbox_id, path)
        return ListFilesResponse(path=path, files=await self.backend.list_dir(sandbox_id, path))

    async def apply_patch(self, sandbox_id: str, req: ApplyPatchRequest) -> ApplyPatchResponse:
        """Write the patch to a file inside the sandbox and run git apply on it (no shell quoting of the text)."""
        cwd = req.cwd or await self.backend.workdir(sandbox_id)
        patch_path = f"/tmp/.orchard-patch-{uuid.uuid4().hex}.diff"
        data = req.patch.encode()
        if len(data) > self.settings.max_file_bytes:
            raise errors.PayloadTooLargeError(f"Patch exceeds the {self.settings.max_file_bytes}-byte limit")
        await self.backend.write_file(sandbox_id, patch_path, data, 0o600)
        spec = ExecSpec(argv=["sh", "-c", _APPLY, "sh", patch_path], cwd=cwd,
                        timeout=float(req.timeout_seconds), output_limit=self.settings.output_limit)
        out = await self.backend.exec(sandbox_id, spec)
        return ApplyPatchResponse(
            success=out.exit_code == 0 and out.error is None, stdout=out.stdout.decode("utf-8", "replace"),
            stderr=out.stderr.decode("utf-8", "replace"), exit_code=out.exit_code, error=out.error)
