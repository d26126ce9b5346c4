"""The images the local backend can start (host, a directory, a snapshot, an OCI image) as overlay layers.

An ``Image`` maps each mount point inside the sandbox ("/" first) to its read-only lower
directories, top layer first; the backend puts a private writable upper on each. ``host``
is a prepared skeleton root plus the host's /usr (and /opt) and a filtered copy of its /etc;
snapshots copy a sandbox's uppers into new versioned layer directories under the state dir
and stack them on the base image's layers.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import secrets
import shutil
import stat
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from orchard.env.podman import podman_env
from orchard.errors import BackendError, NotFoundError, RequestError

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_WORKDIR = "/workspace"
MERGED_USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
SKELETON_DIRS = {
    "dev": 0o755, "proc": 0o555, "sys": 0o555, "tmp": 0o1777, "root": 0o700, "home": 0o755,
    "workspace": 0o755, "mnt": 0o755, "run": 0o755, "var": 0o755, "var/tmp": 0o1777,
    "var/lib": 0o755, "var/cache": 0o755, "var/log": 0o755, "usr": 0o755, "etc": 0o755, "opt": 0o755,
}
ETC_SECRETS = (
    "shadow", "gshadow", "shadow-", "gshadow-", "sudoers", "sudoers.d", "ssh/ssh_host_*_key*",
    "ssl/private", "security/opasswd", "machine-id", "wireguard", "credstore", "credstore.encrypted",
    "NetworkManager/system-connections", "ipsec.secrets", "ppp/chap-secrets", "ppp/pap-secrets",
    "krb5.keytab",
)
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
_OVERLAY_UNSAFE = (":", ",", "\\", "\n")


@dataclass
class Image:
    """A startable image: mount point → read-only lower dirs (top layer first), workdir and env."""

    name: str
    layers: dict[str, list[str]]
    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})


def escape(name: str) -> str:
    """A one-component directory name for any string (injective; no '/', ':', ',' or leading '.')."""
    out = "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in name)
    return "%2E" + out[1:] if out.startswith(".") else out or "%"


def _overlay_safe(path: str) -> str:
    if any(c in path for c in _OVERLAY_UNSAFE):
        raise RequestError(f"{path!r} cannot be an overlay layer: it contains one of ':', ',', '\\\\' or a newline")
    return path


def _cp_a(src: str, dst: str) -> None:
    """``cp -a``: keeps modes, owners, links, device nodes (overlay whiteouts) and xattrs."""
    done = subprocess.run(["cp", "-a", "--", src, dst], capture_output=True, text=True)
    if done.returncode != 0:
        raise BackendError(f"cp -a {src} {dst} failed: {done.stderr.strip()[-500:]}")


def _strip_setid(root: Path) -> None:
    """No setuid/setgid file may land on the host: it would be a root shell for any local user.
    (Inside sandboxes such bits never worked: no_new_privs.)"""
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))


def _tree_size(path: Path) -> int:
    total = 0
    for top, dirs, files in os.walk(path):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            total += os.lstat(os.path.join(top, name)).st_size
    return total


def _write_json_atomically(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def _is_under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


class ImageStore:
    """Resolve image names to overlay layers, prepare the host image, and keep snapshots."""

    def __init__(self, state_dir: Path, *, host_root: str = "/", hide: Iterable[str] = ("/work",),
                 podman: Optional[str] = None, pull_timeout: float = 300.0, roots: Iterable[str] = ()):
        self.state_dir = Path(state_dir).resolve()
        _overlay_safe(str(self.state_dir))
        self.roots = [os.path.realpath(r) for r in roots]     # where directory images may live
        self.host_root = os.path.realpath(host_root)
        self.hidden = sorted({str(self.state_dir), *(os.path.realpath(h) for h in hide)})
        self.podman = podman if podman is not None else shutil.which("podman")
        self.pull_timeout = pull_timeout
        self._images = self.state_dir / "images"
        self._snapshots = self._images / "snapshots"
        self._host_lock = threading.Lock()
        self._oci_mounts: dict[str, str] = {}
        self._etc_cache: dict[str, tuple[float, str]] = {}

    # ------------------------------------------------------------ names
    def resolve(self, name: str) -> Image:
        """The image called ``name``; NotFoundError (listing what exists) when there is none."""
        if name == "host":
            return self._host()
        if name.startswith("/"):
            return self._directory(name)
        manifest = self._manifest_path(name)
        if manifest.is_file():
            return self._load(manifest)
        if self.podman and not name.startswith("-"):
            return self._oci(name)
        raise NotFoundError(self._unknown(name))

    def names(self) -> list[str]:
        """Every image name that resolve() accepts, absolute directories aside."""
        return ["host", *self._snapshot_names(), *self._oci_names()]

    def _unknown(self, name: str, why: str = "") -> str:
        oci = self._oci_names()
        dirs = f"a root-fs directory under {', '.join(self.roots)}" if self.roots else None
        listed = ", ".join(["host", "your snapshots", *([dirs] if dirs else [])])
        tail = f", local OCI images: {', '.join(oci)}" if oci else ""
        return f"Unknown image {name!r}{why}. Available: {listed}{tail}"

    def _snapshot_names(self) -> list[str]:
        names = []
        for manifest in self._snapshots.glob("*/manifest.json"):
            try:
                names.append(json.loads(manifest.read_text())["name"])
            except (OSError, ValueError, KeyError):
                continue
        return sorted(names)

    # ------------------------------------------------------------ a directory
    def _directory(self, name: str) -> Image:
        path = os.path.realpath(name)
        if not any(_is_under(path, root) and path != root for root in self.roots):
            allowed = ", ".join(self.roots) or "none (set ORCHARD_IMAGE_ROOTS)"
            raise RequestError(f"Directory image {name!r} is not under an allowed image root: {allowed}")
        if any(_is_under(path, h) for h in self.hidden):
            raise RequestError(f"Image {name!r} would expose the host or the service's state; use 'host'")
        if not os.path.isdir(path) or not any(os.path.isdir(os.path.join(path, d)) for d in ("bin", "usr")):
            raise NotFoundError(self._unknown(name, ": not a directory holding a root filesystem (bin or usr)"))
        if _is_under(path, str(self.state_dir)) or any(_is_under(h, path) for h in self.hidden):
            raise RequestError(f"Image {name!r} would expose the host or the service's state; use 'host'")
        return Image(name=name, layers={"/": [_overlay_safe(path)]})

    # ------------------------------------------------------------ host
    def _host(self) -> Image:
        with self._host_lock:
            base = self._images / "host"
            layers = {"/": [str(self._skeleton(base / "root"))]}
            for name in self._unmerged_dirs():
                layers[f"/{name}"] = self._host_layer(name, base)
            layers["/usr"] = self._host_layer("usr", base)
            if os.path.isdir(os.path.join(self.host_root, "opt")):
                layers["/opt"] = self._host_layer("opt", base)
            layers["/etc"] = [str(self._filtered_etc(base / "etc"))]
        ordered = {"/": layers.pop("/"), **dict(sorted(layers.items()))}
        return Image(name="host", layers={k: v for k, v in ordered.items() if v})

    def _unmerged_dirs(self) -> list[str]:
        """Top-level lib/bin directories that are real directories (a host without merged /usr)."""
        out = []
        for name in MERGED_USR_LINKS:
            path = os.path.join(self.host_root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                out.append(name)
        return out

    def _host_layer(self, name: str, base: Path) -> list[str]:
        """A host directory as a lower, under a mask layer that whites out hidden paths inside it."""
        src = os.path.realpath(os.path.join(self.host_root, name))
        if any(_is_under(src, h) for h in self.hidden):
            return []
        inside = [os.path.relpath(h, src) for h in self.hidden if _is_under(h, src) and h != src]
        if not inside:
            return [src]
        return [str(self._mask(base / "mask" / escape("/" + name), inside)), src]

    @staticmethod
    def _mask(path: Path, hidden: list[str]) -> Path:
        """A layer of overlay whiteouts (0/0 character devices) over each hidden relative path."""
        key = hashlib.sha256("\n".join(sorted(hidden)).encode()).hexdigest()[:12]
        target = path / key
        if target.is_dir():
            return target
        tmp = path / f".tmp-{secrets.token_hex(4)}"
        for rel in hidden:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            os.mknod(tmp / rel, stat.S_IFCHR | 0o000, os.makedev(0, 0))
        try:
            os.rename(tmp, target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process made it first
        return target

    def _skeleton(self, root: Path) -> Path:
        """An almost empty root: mount points, sticky tmp dirs and the host's merged-/usr links."""
        if root.is_dir():
            return root
        tmp = root.with_name(f".root-{secrets.token_hex(4)}")
        for rel, mode in SKELETON_DIRS.items():
            (tmp / rel).mkdir(parents=True, exist_ok=True)
        for name in MERGED_USR_LINKS:
            self._skeleton_entry(tmp, name)
        for rel, mode in SKELETON_DIRS.items():
            os.chmod(tmp / rel, mode)
        try:
            os.rename(tmp, root)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
        return root

    def _skeleton_entry(self, tmp: Path, name: str) -> None:
        host = os.path.join(self.host_root, name)
        if os.path.islink(host):
            os.symlink(os.readlink(host), tmp / name)
        elif os.path.isdir(host):
            (tmp / name).mkdir(mode=0o755)

    # ------------------------------------------------------------ filtered /etc
    def _etc_signature(self, etc: str) -> str:
        """Cheap change detector: /etc's and its direct entries' mtimes and sizes (re-read at most once a second)."""
        now = time.monotonic()
        cached = self._etc_cache.get(etc)
        if cached and now - cached[0] < 1.0:
            return cached[1]
        signature = self._read_etc_signature(etc)
        self._etc_cache[etc] = (now, signature)
        return signature

    def _read_etc_signature(self, etc: str) -> str:
        digest = hashlib.sha256()
        st = os.stat(etc)
        digest.update(f"{st.st_mtime_ns}".encode())
        with os.scandir(etc) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                s = e.stat(follow_symlinks=False)
                digest.update(f"{e.name}\0{s.st_mtime_ns}\0{s.st_size}\n".encode())
        return digest.hexdigest()[:16]

    def _filtered_etc(self, base: Path) -> Path:
        """A copy of the host's /etc without its secrets, one version per change of the host's."""
        etc = os.path.join(self.host_root, "etc")
        target = base / self._etc_signature(etc)
        if target.is_dir():
            return target
        base.mkdir(parents=True, exist_ok=True)
        tmp = base / f".tmp-{secrets.token_hex(4)}"
        try:
            _cp_a(etc, str(tmp))
            self._strip_secrets(tmp, os.path.realpath(etc))
            os.rename(tmp, target)
        except OSError as e:
            if not target.is_dir():  # else another process made the same version first
                raise BackendError(f"cannot prepare the filtered /etc at {target}: {e}") from e
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target

    def _strip_secrets(self, copy: Path, host_etc: str) -> None:
        for pattern in ETC_SECRETS:
            for path in copy.glob(pattern):
                _remove(path)
        for hidden in self.hidden:
            if _is_under(hidden, host_etc) and hidden != host_etc:
                _remove(copy / os.path.relpath(hidden, host_etc))
        for path in _private_keys(copy):
            _remove(path)
        (copy / "machine-id").write_text(secrets.token_hex(16) + "\n")
        os.chmod(copy / "machine-id", 0o444)

    # ------------------------------------------------------------ OCI (podman)
    def _run_podman(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([str(self.podman), *args], capture_output=True, text=True, timeout=timeout,
                                  env=podman_env())
        except subprocess.TimeoutExpired as e:
            raise BackendError(f"podman {args[0]} {args[1] if len(args) > 1 else ''} timed out "
                               f"after {timeout:.0f}s") from e

    def _oci(self, name: str) -> Image:
        if self._run_podman("image", "exists", name).returncode != 0:
            self._pull(name)
        merged = self._oci_mounts.get(name) or self._mount_oci(name)
        workdir, env = self._oci_config(name)
        return Image(name=name, layers={"/": [_overlay_safe(merged)]}, workdir=workdir, env=env)

    def _pull(self, name: str) -> None:
        try:
            done = self._run_podman("pull", "--quiet", name, timeout=self.pull_timeout)
        except BackendError as e:
            raise NotFoundError(self._unknown(name, f": podman pull failed: {e.detail}")) from e
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1][-300:]
            raise NotFoundError(self._unknown(name, f": not present locally and podman pull failed: {why}"))

    def _mount_oci(self, name: str) -> str:
        done = self._run_podman("image", "mount", name)
        path = done.stdout.strip()
        if done.returncode != 0 or not os.path.isdir(path):
            raise BackendError(f"podman image mount {name} failed: {done.stderr.strip()[-300:]}")
        self._oci_mounts[name] = path
        return path

    def _oci_config(self, name: str) -> tuple[str, dict[str, str]]:
        done = self._run_podman("image", "inspect", name)
        try:
            config = (json.loads(done.stdout)[0].get("Config") or {}) if done.returncode == 0 else {}
        except (ValueError, IndexError, AttributeError):
            config = {}
        env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
        return config.get("WorkingDir") or DEFAULT_WORKDIR, env or {"PATH": DEFAULT_PATH}

    def _oci_names(self) -> list[str]:
        if not self.podman:
            return []
        try:
            done = self._run_podman("images", "--format", "{{.Repository}}:{{.Tag}}", timeout=30)
        except BackendError:
            return []
        names = {n for n in done.stdout.split() if "<none>" not in n} if done.returncode == 0 else set()
        return sorted(names)

    # ------------------------------------------------------------ snapshots
    def _manifest_path(self, name: str) -> Path:
        return self._snapshots / escape(name) / "manifest.json"

    @staticmethod
    def _load(manifest: Path) -> Image:
        data = json.loads(manifest.read_text())
        image = Image(name=data["name"], layers=data["layers"], workdir=data["workdir"], env=data["env"])
        missing = [p for lowers in image.layers.values() for p in lowers if not os.path.isdir(p)]
        if missing:
            raise BackendError(f"Image {image.name!r} lost its layers: {', '.join(missing[:3])}")
        return image

    def snapshot(self, name: str, base: Image, uppers: dict[str, str]) -> int:
        """Copy a sandbox's uppers into a new top layer over ``base``; return the bytes added."""
        if name == "host" or name.startswith("/") or not name:
            raise RequestError(f"{name!r} cannot name a snapshot")
        home = self._snapshots / escape(name)
        version = self._new_version(home / "layers")
        layers = {mp: list(lowers) for mp, lowers in base.layers.items()}
        try:
            added = sum(self._copy_upper(version, mp, upper, layers) for mp, upper in uppers.items())
        except BaseException:
            shutil.rmtree(version, ignore_errors=True)
            raise
        manifest = {"name": name, "base": base.name, "layers": layers, "workdir": base.workdir,
                    "env": base.env, "created_at": time.time(), "version": int(version.name)}
        _write_json_atomically(home / "manifest.json", manifest)
        return added

    @staticmethod
    def _new_version(layers: Path) -> Path:
        """A fresh numbered directory: running sandboxes keep the versions they mounted."""
        layers.mkdir(parents=True, exist_ok=True)
        n = max((int(p.name) for p in layers.iterdir() if p.name.isdigit()), default=0) + 1
        while True:
            try:
                (layers / str(n)).mkdir()
                return layers / str(n)
            except FileExistsError:
                n += 1

    @staticmethod
    def _copy_upper(version: Path, mountpoint: str, upper: str, layers: dict[str, list[str]]) -> int:
        if not os.path.isdir(upper):
            raise BackendError(f"upper directory {upper} of {mountpoint} does not exist")
        if not os.listdir(upper):
            return 0
        dest = version / escape(mountpoint)
        _cp_a(upper, str(dest))
        _strip_setid(dest)
        layers[mountpoint] = [str(dest), *layers.get(mountpoint, [])]
        return _tree_size(dest)

    def delete_snapshot(self, name: str, in_use: Iterable[str] = ()) -> None:
        """Forget a snapshot; free layers of deleted snapshots that no image and no path in ``in_use`` needs."""
        manifest = self._manifest_path(name)
        if not manifest.is_file():
            raise NotFoundError(self._unknown(name))
        manifest.unlink()
        homes = [h for h in self._snapshots.iterdir() if not (h / "manifest.json").exists()]
        self._collect(homes, set(in_use))

    def prune(self, in_use: Iterable[str]) -> None:
        """Free every layer version no image needs; ``in_use`` must list every lower of every live sandbox."""
        self._collect(list(self._snapshots.iterdir()) if self._snapshots.is_dir() else [], set(in_use))

    def _collect(self, homes: list[Path], in_use: set[str]) -> None:
        needed = in_use | {p for m in self._snapshots.glob("*/manifest.json")
                           for lowers in json.loads(m.read_text())["layers"].values() for p in lowers}
        for home in homes:
            layers = home / "layers"
            for version in list(layers.iterdir()) if layers.is_dir() else []:
                if not any(_is_under(p, str(version)) for p in needed):
                    shutil.rmtree(version, ignore_errors=True)
            for d in (layers, home):
                try:
                    d.rmdir()
                except OSError:
                    break


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _private_keys(top: Path) -> list[Path]:
    """Regular ``*.key`` files, and ``*.pem`` files that hold a private key."""
    found = []
    for dirpath, _, files in os.walk(top):
        for name in fnmatch.filter(files, "*.key") + fnmatch.filter(files, "*.pem"):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            if name.endswith(".key") or b"PRIVATE KEY" in path.read_bytes()[: 1 << 20]:
                found.append(path)
    return found
