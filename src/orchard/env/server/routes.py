"""HTTP routes: each a thin adapter from the wire models to the service core."""

from __future__ import annotations

from typing import Optional, Union

from fastapi import APIRouter, Depends, Header, Query, Request, Response

from orchard import __version__
from orchard.env.protocol import (ApplyPatchRequest, ApplyPatchResponse, Capacity, CreateSandboxRequest,
                                  CreateSandboxResponse, DeleteResponse, DownloadResponse, ExecQueued, ExecRequest,
                                  Health, HeartbeatResponse, Job, ListFilesResponse, ResourcesResponse, RootInfo,
                                  SandboxInfo, SandboxList, SandboxUsage, SnapshotRequest, SnapshotResponse,
                                  UploadRequest, UploadResponse)
from orchard.env.quantities import parse_cpu, parse_memory
from orchard.env.server.auth import caller
from orchard.env.service.callers import Caller
from orchard.env.service.core import EnvCore

public = APIRouter()
router = APIRouter()
Auth = Depends(caller)


def core(request: Request) -> EnvCore:
    return request.app.state.core


@public.get("/", response_model=RootInfo)
async def root() -> RootInfo:
    return RootInfo(service="orchard-env", version=__version__, status="running")


@public.get("/health", response_model=Health)
async def health() -> Health:
    return Health(status="healthy")


@router.get("/metrics")
async def metrics(request: Request, who: Caller = Auth) -> Response:
    return Response(core(request).metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/resources", response_model=ResourcesResponse)
async def resources(request: Request, who: Caller = Auth) -> ResourcesResponse:
    return await resources_of(core(request), who)


@router.post("/sandboxes", response_model=CreateSandboxResponse)
async def create_sandbox(body: CreateSandboxRequest, request: Request, who: Caller = Auth) -> CreateSandboxResponse:
    r = await core(request).sandboxes.create(body, who)
    return CreateSandboxResponse(**r.model_dump(include=set(CreateSandboxResponse.model_fields)))


@router.get("/sandboxes", response_model=SandboxList)
async def list_sandboxes(request: Request, status: Optional[str] = None, who: Caller = Auth) -> SandboxList:
    return SandboxList(sandboxes=await core(request).sandboxes.list(who, status))


@router.get("/sandboxes/{sandbox_id}", response_model=SandboxInfo)
async def get_sandbox(sandbox_id: str, request: Request, who: Caller = Auth) -> SandboxInfo:
    return (await core(request).sandboxes.get(sandbox_id, who)).info()


@router.get("/sandboxes/{sandbox_id}/wait", response_model=SandboxInfo)
async def wait_sandbox(sandbox_id: str, request: Request, timeout: float = Query(60.0, gt=0, le=3600),
                       who: Caller = Auth) -> SandboxInfo:
    return await core(request).sandboxes.wait(sandbox_id, who, timeout)


@router.delete("/sandboxes/{sandbox_id}", response_model=DeleteResponse)
async def delete_sandbox(sandbox_id: str, request: Request, who: Caller = Auth) -> DeleteResponse:
    await core(request).sandboxes.delete(sandbox_id, who)
    return DeleteResponse(status="deleted", sandbox_id=sandbox_id)


@router.post("/sandboxes/{sandbox_id}/heartbeat", response_model=HeartbeatResponse)
async def heartbeat(sandbox_id: str, request: Request, who: Caller = Auth) -> HeartbeatResponse:
    r = await core(request).sandboxes.heartbeat(sandbox_id, who)
    return HeartbeatResponse(status="ok", sandbox_id=sandbox_id, expires_at=r.expires_at)


@router.post("/sandboxes/{sandbox_id}/exec", response_model=Union[Job, ExecQueued])
async def exec_command(sandbox_id: str, body: ExecRequest, request: Request, who: Caller = Auth,
                       idempotency_key: Optional[str] = Header(None, max_length=200)) -> Union[Job, ExecQueued]:
    c = core(request)
    job = await c.jobs.submit(sandbox_id, body, who, idempotency_key)
    if not body.wait:
        return ExecQueued(job_id=job.job_id, status="queued")
    return (await c.jobs.wait(job.job_id, who, c.settings.exec_wait_max)).wire()


@router.get("/jobs/{job_id}", response_model=Job)
async def get_job(job_id: str, request: Request, who: Caller = Auth) -> Job:
    return (await core(request).jobs.get(job_id, who)).wire()


@router.get("/jobs/{job_id}/wait", response_model=Job)
async def wait_job(job_id: str, request: Request, timeout: float = Query(30.0, gt=0, le=3600),
                   who: Caller = Auth) -> Job:
    return (await core(request).jobs.wait(job_id, who, timeout)).wire()


@router.post("/sandboxes/{sandbox_id}/files", response_model=UploadResponse)
async def upload(sandbox_id: str, body: UploadRequest, request: Request, who: Caller = Auth) -> UploadResponse:
    c = core(request)
    await c.sandboxes.get_ready(sandbox_id, who)
    return await c.files.upload(sandbox_id, body)


@router.get("/sandboxes/{sandbox_id}/files", response_model=DownloadResponse)
async def download(sandbox_id: str, request: Request, path: str = Query(min_length=1),
                   who: Caller = Auth) -> DownloadResponse:
    c = core(request)
    await c.sandboxes.get_ready(sandbox_id, who)
    return await c.files.download(sandbox_id, path)


@router.get("/sandboxes/{sandbox_id}/files/list", response_model=ListFilesResponse)
async def list_files(sandbox_id: str, request: Request, path: str = Query(".", min_length=1),
                     who: Caller = Auth) -> ListFilesResponse:
    c = core(request)
    await c.sandboxes.get_ready(sandbox_id, who)
    return await c.files.list(sandbox_id, path)


@router.post("/sandboxes/{sandbox_id}/apply_patch", response_model=ApplyPatchResponse)
async def apply_patch(sandbox_id: str, body: ApplyPatchRequest, request: Request,
                      who: Caller = Auth) -> ApplyPatchResponse:
    c = core(request)
    await c.sandboxes.get_ready(sandbox_id, who)
    return await c.files.apply_patch(sandbox_id, body)


@router.post("/sandboxes/{sandbox_id}/snapshot", response_model=SnapshotResponse)
async def snapshot(sandbox_id: str, body: SnapshotRequest, request: Request, who: Caller = Auth) -> SnapshotResponse:
    size = await core(request).sandboxes.snapshot(sandbox_id, body.image, who)
    return SnapshotResponse(image=body.image, sandbox_id=sandbox_id, size=size)


async def resources_of(c: EnvCore, who: Caller) -> ResourcesResponse:
    """Capacity, requests of live sandboxes, and per-sandbox rows for admins."""
    cpu, mem = c.backend.capacity()
    rows = [SandboxUsage(sandbox_id=r.sandbox_id, cpu=_cpu(r.cpu), memory_bytes=_mem(r.memory),
                         memory_used_bytes=c.backend.memory_used(r.sandbox_id))
            for r in await c.store.list_sandboxes() if r.status in ("pending", "ready")]
    req_cpu, req_mem = sum(r.cpu for r in rows), sum(r.memory_bytes for r in rows)
    total = Capacity(cpu=cpu, memory_bytes=mem)
    return ResourcesResponse(
        status="ok", total_capacity=total, total_allocatable=total,
        total_requested=Capacity(cpu=req_cpu, memory_bytes=req_mem),
        available=Capacity(cpu=max(0.0, cpu - req_cpu), memory_bytes=max(0, mem - req_mem)),
        sandbox_count=len(rows), sandboxes=rows if who.admin else None)


def _cpu(text: Optional[str]) -> float:
    return parse_cpu(text) if text else 0.0


def _mem(text: Optional[str]) -> int:
    return parse_memory(text) if text else 0
