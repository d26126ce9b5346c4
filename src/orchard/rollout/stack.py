"""Start the parts a rollout run needs on this machine: Orchard Env, a model server and the recording proxy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import httpx

from orchard.env.runner import free_port
from orchard.errors import OrchardError


def _die_with_parent() -> None:
    """In the child: SIGTERM when the engine dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)


class Proc:
    """One `orchard ...` child process on a free port, healthy before use, stopped on exit; logs to a file."""

    def __init__(self, name: str, argv: list[str], port: int, log_dir: Path, env: Optional[dict[str, str]] = None,
                 health: str = "/health"):
        self.name, self.argv, self.port = name, argv, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_dir / f"{name}.log"
        self.env = {**os.environ, **(env or {})}
        self.health = health
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 120.0) -> "Proc":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "orchard.cli", *self.argv], env=self.env,
                                     stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise OrchardError(f"{self.name} exited early: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + self.health, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise OrchardError(f"{self.name} not healthy after {timeout:.0f}s: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Stack:
    """Orchard Env (local backend) + a model server + the proxy in front of it; a context manager.

    ``model`` is a URL (an existing OpenAI-compatible server: vLLM, SGLang, `orchard model serve`), or
    ``oracle`` (the scripted server answering with the oracle teacher over ``tasks_file``), or ``local``
    (`orchard model serve` with SmolLM2 on this machine). Pass ``proxy_url`` to use a running proxy (then
    ``model`` is only a label) and ``env_url`` for a running Orchard Env (its ORCHARD_FORWARD_ALLOWLIST must
    hold the proxy's host:port).
    """

    def __init__(self, model: str, work_dir: Path, tasks_file: Optional[Path] = None, oracle_error_rate: float = 0.3,
                 oracle_seed: int = 0, env_url: Optional[str] = None, tools_dir: Optional[Path] = None,
                 proxy_url: Optional[str] = None):
        self.model, self.work_dir, self.tasks_file = model, Path(work_dir), tasks_file
        self.oracle_env = {"ORCHARD_ORACLE_ERROR_RATE": str(oracle_error_rate), "ORCHARD_ORACLE_SEED": str(oracle_seed)}
        self.env_url, self.tools_dir = env_url, tools_dir
        self.procs: list[Proc] = []
        self.model_url, self.proxy_url = "", proxy_url or ""

    def __enter__(self) -> "Stack":
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            if not self.proxy_url:
                self.model_url = self._model()
                self.proxy_url = self._proxy()
            self.env_url = self.env_url or self._service(httpx.URL(self.proxy_url).port or 80)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _proxy(self) -> str:
        port = free_port()
        argv = ["proxy", "serve", "--upstream", self.model_url, "--port", str(port), "--store",
                str(self.work_dir / "proxy-store"), "--no-auth", "--durability", "flush"]
        return self._start(Proc("proxy", argv, port, self.work_dir))

    def _start(self, proc: Proc, timeout: float = 120.0) -> str:
        self.procs.append(proc)
        return proc.start(timeout).url

    def _model(self) -> str:
        if self.model.startswith(("http://", "https://")):
            return self.model
        port = free_port()
        if self.model == "oracle":
            if self.tasks_file is None:
                raise OrchardError("the oracle teacher needs the tasks it answers for")
            env = {**self.oracle_env, "ORCHARD_ORACLE_TASKS": str(self.tasks_file)}
            argv = ["model", "serve", "--scripted", "--policy", "orchard.rollout.oracle:policy", "--port", str(port)]
            return self._start(Proc("model", argv, port, self.work_dir, env))
        if self.model == "local":
            return self._start(Proc("model", ["model", "serve", "--port", str(port)], port, self.work_dir), 900)
        raise OrchardError(f"--model must be a URL, 'oracle' or 'local', not {self.model!r}")

    def _service(self, proxy_port: int) -> str:
        """Orchard Env with its state in the run directory: a resumed run's service adopts and reaps what a crash left."""
        env = {"ORCHARD_FORWARD_ALLOWLIST": f"127.0.0.1:{proxy_port}"}
        if self.tools_dir:
            env["ORCHARD_TOOLS_DIR"] = str(self.tools_dir)
        port = free_port()
        argv = ["env", "serve", "--no-auth", "--port", str(port), "--state-dir", str(self.work_dir / "env-state"),
                "--log-level", "warning"]
        url = self._start(Proc("env", argv, port, self.work_dir, env), 60)
        _reap_leftovers(url)
        return url

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def _reap_leftovers(url: str) -> None:
    """Delete the sandboxes a killed run left in this run's own service (it adopted them on start)."""
    from orchard.client.sync import SandboxClient

    with SandboxClient(base_url=url, auto_cleanup=False) as client:
        for info in client.list_sandboxes():
            client.delete_sandbox(info.sandbox_id)
