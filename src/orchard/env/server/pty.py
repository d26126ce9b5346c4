"""The PTY WebSocket: an interactive terminal in a sandbox, JSON frames with base64 bytes."""

from __future__ import annotations

import asyncio
import base64
import os
import shlex
import signal
from typing import Optional

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import TypeAdapter, ValidationError

from orchard import errors
from orchard.env.backends.base import PtyProcess
from orchard.env.protocol import PtyClientFrame, PtyExit, PtyInit, PtyReady, PtyStdout
from orchard.env.server.auth import authenticate
from orchard.env.service.jobs import argv_of

router = APIRouter()
_frames = TypeAdapter(PtyClientFrame)
_SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL,
            "HUP": signal.SIGHUP, "QUIT": signal.SIGQUIT}
INIT_TIMEOUT = 10.0


def _key_and_protocol(ws: WebSocket) -> tuple[Optional[str], Optional[str]]:
    for proto in ws.scope.get("subprotocols", []):
        if proto.startswith("api_key."):
            return proto[len("api_key."):], proto
    return ws.query_params.get("api_key") or ws.headers.get("x-api-key"), None


async def _fail(ws: WebSocket, message: str, code: int) -> None:
    await ws.send_json({"type": "error", "message": message})
    await ws.close(code)


@router.websocket("/sandboxes/{sandbox_id}/exec/pty")
async def pty_session(ws: WebSocket, sandbox_id: str) -> None:
    core = ws.app.state.core
    key, proto = _key_and_protocol(ws)
    await ws.accept(subprotocol=proto)
    try:
        who = authenticate(core.settings, key)
        await core.sandboxes.get_ready(sandbox_id, who)
        init = await _read_init(ws)
        argv = argv_of(shlex.join(init.cmd), True) if init.login_shell else init.cmd
        proc = await core.backend.open_pty(sandbox_id, argv, init.cwd, init.env, init.rows, init.cols)
    except errors.OrchardError as e:
        code = 4400 if e.status_code < 500 else 4500
        return await _fail(ws, e.detail, code)
    except WebSocketDisconnect:
        return
    await _bridge(ws, proc)


async def _read_init(ws: WebSocket) -> PtyInit:
    try:
        raw = await asyncio.wait_for(ws.receive_text(), INIT_TIMEOUT)
        frame = _frames.validate_json(raw)
    except asyncio.TimeoutError as e:
        raise errors.RequestError(f"No init frame within {INIT_TIMEOUT:g}s") from e
    except ValidationError as e:
        raise errors.RequestError(f"Bad init frame: {e.errors()[0]['msg']}") from e
    if not isinstance(frame, PtyInit):
        raise errors.RequestError("The first frame must be of type 'init'")
    return frame


async def _bridge(ws: WebSocket, proc: PtyProcess) -> None:
    await ws.send_text(PtyReady(pid=proc.pid).model_dump_json())
    pump = asyncio.create_task(_pump_output(ws, proc))
    inbound = asyncio.create_task(_pump_input(ws, proc))
    waiter = asyncio.create_task(proc.wait())
    try:
        done, _ = await asyncio.wait({waiter, inbound}, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            await asyncio.wait_for(pump, 2.0)
            await ws.send_text(PtyExit(code=waiter.result()).model_dump_json())
            await ws.close(1000)
    except (WebSocketDisconnect, RuntimeError, asyncio.TimeoutError):
        pass
    finally:
        for task in (pump, inbound, waiter):
            task.cancel()
        await asyncio.gather(pump, inbound, waiter, return_exceptions=True)
        await proc.kill()       # the client went away or the session ended: no process may outlive it


async def _pump_output(ws: WebSocket, proc: PtyProcess) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    def readable() -> None:
        try:
            data = os.read(proc.master_fd, 65536)
        except OSError:
            data = b""
        queue.put_nowait(data)
        if not data:
            loop.remove_reader(proc.master_fd)

    loop.add_reader(proc.master_fd, readable)
    try:
        while data := await queue.get():
            await ws.send_text(PtyStdout(data=base64.b64encode(data).decode()).model_dump_json())
    finally:
        loop.remove_reader(proc.master_fd)


async def _pump_input(ws: WebSocket, proc: PtyProcess) -> None:
    while True:
        try:
            frame = _frames.validate_json(await ws.receive_text())
        except ValidationError as e:
            await ws.send_json({"type": "error", "message": f"Bad frame: {e.errors()[0]['msg']}"})
            continue
        if frame.type == "stdin":
            os.write(proc.master_fd, base64.b64decode(frame.data))
        elif frame.type == "resize":
            proc.resize(frame.rows, frame.cols)
        elif frame.type == "signal":
            proc.signal(_SIGNALS[frame.sig])
        elif frame.type == "close":
            return
