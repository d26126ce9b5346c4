"""Run Podman with the project's settings (CLI and API service), and build small local OCI images (no registry needed)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Optional

from orchard.env.runner import terminate

CONF = Path(__file__).with_name("podman-containers.conf")
BUSYBOX_IMAGE = "localhost/orchard-busybox:latest"
_TOOLS = ("sh", "ls", "cat", "echo", "sleep", "true", "false", "mkdir", "rm", "ps", "wc", "id", "pwd", "env",
          "head", "tr", "grep", "sed", "dd", "ln", "touch", "printf", "test", "kill", "uname", "hostname")


def podman_env() -> dict[str, str]:
    """The environment for podman: the project's containers.conf unless the caller chose one."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONF))
    return env


def podman(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run `podman ARGS` and capture its output."""
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=podman_env())


def available() -> bool:
    """Podman is installed and answers."""
    return shutil.which("podman") is not None and podman("version", timeout=30).returncode == 0


def ensure_busybox_image(name: str = BUSYBOX_IMAGE) -> Optional[str]:
    """A tiny OCI image made from the host's static busybox with `podman import`; None when impossible."""
    busybox = shutil.which("busybox")
    if not available() or busybox is None:
        return None
    if podman("image", "exists", name).returncode == 0:
        return name
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "rootfs.tar"
        with tarfile.open(tar_path, "w") as tar:
            _add_rootfs(tar, Path(busybox))
        done = podman("import", "--change", "WORKDIR /work", str(tar_path), name)
    return name if done.returncode == 0 else None


def _add_rootfs(tar: tarfile.TarFile, busybox: Path) -> None:
    for directory in ("bin", "tmp", "etc", "work", "root"):
        info = tarfile.TarInfo(directory)
        info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
        tar.addfile(info)
    tar.add(str(busybox), arcname="bin/busybox")
    for tool in _TOOLS:
        link = tarfile.TarInfo(f"bin/{tool}")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        tar.addfile(link)


class PodmanService:
    """`podman system service` answering the Docker Engine API on a unix socket, while the context lasts."""

    def __init__(self, socket_path: str, log_path: Optional[str] = None):
        self.socket_path = socket_path
        self.url = f"unix://{socket_path}"
        self.log_path = log_path or f"{socket_path}.log"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 30.0) -> "PodmanService":
        """Launch and wait until the API answers /_ping."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(["podman", "system", "service", "--time=0", self.url], env=podman_env(),
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"podman system service did not start: {Path(self.log_path).read_text()[-2000:]}")
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                s.connect(self.socket_path)
                s.sendall(b"GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n")
                return s.recv(64).startswith(b"HTTP/1.")
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM (containers keep running: they belong to the storage, not to the service)."""
        terminate(self.proc)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def __enter__(self) -> "PodmanService":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
