"""SandboxFS resolves every path inside a fake sandbox root: planted links and '..' never reach the host."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchard.env.backends.local_fs import SandboxFS, normalize
from orchard.errors import NotFoundError, PayloadTooLargeError, RequestError

SECRET = b"HOST SECRET"


@pytest.fixture()
def world(tmp_path: Path) -> dict[str, Path]:
    """A host file and dir outside a fake sandbox root full of planted links."""
    host_file = tmp_path / "host" / "secret.txt"
    host_dir = host_file.parent
    host_dir.mkdir()
    host_file.write_bytes(SECRET)
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "shadow").write_bytes(b"sandbox shadow")
    ws = root / "workspace"
    ws.mkdir()
    (ws / "hello.txt").write_bytes(b"hello")
    (ws / "sub").mkdir()
    links = {
        "abs_shadow": "/etc/shadow",                   # the sandbox's own /etc/shadow
        "abs_host": str(host_file),                    # host path: must resolve inside the root
        "abs_host_dir": str(host_dir),
        "rel_escape": "../../../../../../" + str(host_file).lstrip("/"),
        "up": "../../../../../../..",                   # a directory link that climbs
        "broken": "/does/not/exist",
        "loop": "loop",
    }
    for name, target in links.items():
        os.symlink(target, ws / name)
    return {"root": root, "host_file": host_file, "host_dir": host_dir, "tmp": tmp_path}


def host_untouched(w: dict[str, Path]) -> None:
    assert w["host_file"].read_bytes() == SECRET
    assert sorted(os.listdir(w["host_dir"])) == ["secret.txt"]


def test_normalize_clamps_at_root():
    assert normalize("/../../etc/passwd") == "etc/passwd"
    assert normalize("/") == "."
    assert normalize("a/./b/../c") == "a/c"
    with pytest.raises(RequestError):
        normalize("/a\x00b")


def test_read_plain_and_errors(world):
    fs = SandboxFS(str(world["root"]))
    assert fs.read("/workspace/hello.txt", 100) == b"hello"
    with pytest.raises(NotFoundError):
        fs.read("/workspace/missing", 100)
    with pytest.raises(RequestError) as e:
        fs.read("/workspace", 100)
    assert e.value.status_code == 400 and "directory" in e.value.detail
    with pytest.raises(PayloadTooLargeError) as e:
        fs.read("/workspace/hello.txt", 4)
    assert e.value.status_code == 413


def test_read_fifo_is_refused_not_hung(world):
    os.mkfifo(world["root"] / "workspace" / "fifo")
    with pytest.raises(RequestError):
        SandboxFS(str(world["root"])).read("/workspace/fifo", 100)


def test_absolute_link_reads_the_sandbox_file(world):
    fs = SandboxFS(str(world["root"]))
    assert fs.read("/workspace/abs_shadow", 100) == b"sandbox shadow"


@pytest.mark.parametrize("path", [
    "/workspace/abs_host",
    "/workspace/rel_escape",
    "/workspace/up/host/secret.txt",
    "/workspace/abs_host_dir/secret.txt",
    "/../../../../../../{host}",
    "/workspace/../../../../{host}",
    "/workspace/broken",
])
def test_nothing_outside_is_read(world, path):
    fs = SandboxFS(str(world["root"]))
    rel_host = str(world["host_file"]).lstrip("/")
    with pytest.raises(NotFoundError):
        fs.read(path.format(host=rel_host), 100)


def test_climbing_link_stays_at_the_sandbox_root(world):
    fs = SandboxFS(str(world["root"]))
    assert fs.read("/workspace/up/etc/shadow", 100) == b"sandbox shadow"
    assert [e.name for e in fs.list("/workspace/up")] == ["etc", "workspace"]


def test_symlink_loop_is_a_request_error(world):
    with pytest.raises(RequestError):
        SandboxFS(str(world["root"])).read("/workspace/loop", 100)


def test_write_creates_parents_and_modes(world):
    fs = SandboxFS(str(world["root"]))
    fs.write("/workspace/a/b/c.txt", b"data", None)
    target = world["root"] / "workspace" / "a" / "b" / "c.txt"
    assert target.read_bytes() == b"data"
    assert target.stat().st_mode & 0o7777 == 0o644
    assert (world["root"] / "workspace" / "a").stat().st_mode & 0o7777 == 0o755
    fs.write("/workspace/a/b/c.txt", b"more", 0o755)
    assert target.stat().st_mode & 0o7777 == 0o755
    fs.write("/workspace/a/b/c.txt", b"kept", None)            # an existing file keeps its mode
    assert target.stat().st_mode & 0o7777 == 0o755 and target.read_bytes() == b"kept"
    assert not [n for n in os.listdir(target.parent) if n.startswith(".")]  # no temp left


def test_write_errors(world):
    fs = SandboxFS(str(world["root"]))
    with pytest.raises(RequestError):
        fs.write("/workspace/sub", b"x", None)
    with pytest.raises(RequestError):
        fs.write("/", b"x", None)
    with pytest.raises(RequestError):
        fs.write("/workspace/hello.txt/x", b"x", None)


def test_write_replaces_a_planted_final_link_never_follows_it_out(world):
    fs = SandboxFS(str(world["root"]))
    for name in ("abs_host", "rel_escape"):
        fs.write(f"/workspace/{name}", b"mine", None)
        planted = world["root"] / "workspace" / name
        assert not planted.is_symlink() and planted.read_bytes() == b"mine"
    host_untouched(world)


def test_write_through_climbing_dir_link_lands_inside(world):
    fs = SandboxFS(str(world["root"]))
    fs.write("/workspace/up/x.txt", b"inside", None)
    assert (world["root"] / "x.txt").read_bytes() == b"inside"
    rel_host_dir = str(world["host_dir"]).lstrip("/")
    fs.write(f"/../../../{rel_host_dir}/new.txt", b"inside too", None)
    assert (world["root"] / rel_host_dir / "new.txt").read_bytes() == b"inside too"
    assert not (world["tmp"] / "x.txt").exists()
    host_untouched(world)


def test_write_through_absolute_dir_link_never_reaches_host(world):
    fs = SandboxFS(str(world["root"]))
    try:
        fs.write("/workspace/abs_host_dir/evil.txt", b"x", None)
    except NotFoundError:
        pass  # the link dangles inside the sandbox: refusing is fine
    host_untouched(world)


def test_list(world):
    fs = SandboxFS(str(world["root"]))
    entries = {e.name: e for e in fs.list("/workspace")}
    assert list(entries) == sorted(entries)
    assert entries["hello.txt"].type == "file" and entries["hello.txt"].size == 5
    assert entries["sub"].type == "directory"
    assert entries["broken"].type == "symlink"               # broken links are listed
    assert entries["abs_host"].type == "symlink"
    assert entries["abs_host"].size == len(str(world["host_file"]))
    assert entries["hello.txt"].modified.endswith("+00:00")
    with pytest.raises(NotFoundError):
        fs.list("/nope")
    with pytest.raises(RequestError):
        fs.list("/workspace/hello.txt")
    with pytest.raises(NotFoundError):
        fs.list("/workspace/abs_host_dir")                    # host dir is not in the sandbox


def test_stat_kind(world):
    fs = SandboxFS(str(world["root"]))
    assert fs.stat_kind("/workspace") == "directory"
    assert fs.stat_kind("/workspace/hello.txt") == "file"
    assert fs.stat_kind("/workspace/abs_shadow") == "file"
    assert fs.stat_kind("/workspace/abs_host") is None
    assert fs.stat_kind("/workspace/broken") is None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_magic_links_are_refused(world):
    """With the host /proc inside the root, /proc/self/root would be the host '/': it must not resolve."""
    root = world["root"]
    (root / "proc").mkdir()
    os.symlink("/proc/self/root" + str(world["host_file"]), root / "workspace" / "magic")
    script = textwrap.dedent(f"""
        from orchard.env.backends.local_fs import SandboxFS
        from orchard.errors import RequestError
        try:
            print(SandboxFS({str(root)!r}).read("/workspace/magic", 100))
        except RequestError as e:
            print("refused", e.detail)
    """)
    inner = f'mount --bind /proc {root}/proc && exec "$0" -c "$1"'
    out = subprocess.run(["unshare", "-m", "sh", "-c", inner, sys.executable, script],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused"), out.stdout
