"""ImageStore: host image layers and filtered /etc, directories, OCI names, snapshots stacked as real overlays."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from orchard.env.backends.local_images import Image, ImageStore, escape
from orchard.errors import NotFoundError, RequestError

ROOT = os.geteuid() == 0


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def is_whiteout(path: Path) -> bool:
    st = os.lstat(path)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0)


@pytest.fixture()
def fake_host(tmp_path: Path) -> Path:
    """A host tree without merged /usr for lib, with secrets in /etc and a service dir in /opt."""
    host = tmp_path / "host"
    files = {
        "etc/passwd": "root:x:0:0:root:/root:/bin/bash\n",
        "etc/hosts": "127.0.0.1 localhost\n",
        "etc/shadow": "root:$6$secret:19000::::::\n", "etc/gshadow": "root:*::\n",
        "etc/shadow-": "old\n", "etc/gshadow-": "old\n", "etc/sudoers": "root ALL=(ALL) ALL\n",
        "etc/sudoers.d/extra": "x\n", "etc/ssh/ssh_host_rsa_key": "KEY\n",
        "etc/ssh/ssh_host_rsa_key.pub": "PUB\n", "etc/ssh/ssh_config": "Host *\n",
        "etc/ssl/private/site.pem": "-----BEGIN PRIVATE KEY-----\n", "etc/ssl/certs/ca.pem": "-----BEGIN CERTIFICATE-----\n",
        "etc/ssl/certs/mixed.pem": "-----BEGIN CERTIFICATE-----\n-----BEGIN RSA PRIVATE KEY-----\n",
        "etc/app/server.key": "secret\n", "etc/security/opasswd": "x\n", "etc/machine-id": "0" * 32 + "\n",
        "usr/bin/tool": "#!/bin/sh\n", "lib/libc.so": "elf\n", "opt/app/run": "x\n", "opt/state/db": "private\n",
    }
    for rel, text in files.items():
        (host / rel).parent.mkdir(parents=True, exist_ok=True)
        (host / rel).write_text(text)
    os.symlink("usr/bin", host / "bin")
    return host


def store_for(tmp_path: Path, host: Path, **kw) -> ImageStore:
    return ImageStore(tmp_path / "state", host_root=str(host), hide=[str(host / "opt" / "state")], podman="", **kw)


# ---------------------------------------------------------------- host
def test_host_layers_and_skeleton(tmp_path, fake_host):
    image = store_for(tmp_path, fake_host).resolve("host")
    assert list(image.layers)[0] == "/"
    assert set(image.layers) == {"/", "/lib", "/usr", "/opt", "/etc"}
    assert image.layers["/usr"] == [str(fake_host / "usr")]
    assert image.layers["/lib"] == [str(fake_host / "lib")]       # not merged: mounted as a layer
    skel = Path(image.layers["/"][0])
    assert os.readlink(skel / "bin") == "usr/bin"                 # merged: copied as the same link
    assert (skel / "lib").is_dir() and not (skel / "lib").is_symlink()
    assert not (skel / "sbin").exists() and not (skel / "lib64").exists()
    assert mode(skel / "tmp") == 0o1777 and mode(skel / "var" / "tmp") == 0o1777
    assert mode(skel / "root") == 0o700 and os.listdir(skel / "root") == []
    for d in ("dev", "proc", "sys", "home", "workspace", "mnt", "run", "var/lib", "var/cache", "var/log", "usr", "etc", "opt"):
        assert (skel / d).is_dir(), d
    assert (image.workdir, image.env["PATH"].split(":")[-1]) == ("/workspace", "/bin")


@pytest.mark.skipif(not ROOT, reason="whiteouts need mknod")
def test_hidden_paths_are_whited_out(tmp_path, fake_host):
    image = store_for(tmp_path, fake_host).resolve("host")
    mask, opt = image.layers["/opt"]
    assert opt == str(fake_host / "opt") and is_whiteout(Path(mask) / "state")
    assert os.listdir(mask) == ["state"]


def test_filtered_etc_has_no_secrets(tmp_path, fake_host):
    etc = Path(store_for(tmp_path, fake_host).resolve("host").layers["/etc"][0])
    for gone in ("shadow", "gshadow", "shadow-", "gshadow-", "sudoers", "sudoers.d", "ssh/ssh_host_rsa_key",
                 "ssh/ssh_host_rsa_key.pub", "ssl/private", "security/opasswd", "app/server.key", "ssl/certs/mixed.pem"):
        assert not (etc / gone).exists(), gone
    for kept in ("passwd", "hosts", "ssh/ssh_config", "ssl/certs/ca.pem"):
        assert (etc / kept).exists(), kept
    machine_id = (etc / "machine-id").read_text().strip()
    assert len(machine_id) == 32 and machine_id != "0" * 32


def test_filtered_etc_is_reused_and_refreshed_on_change(tmp_path, fake_host):
    store = store_for(tmp_path, fake_host)
    first = store.resolve("host").layers["/etc"][0]
    assert store.resolve("host").layers["/etc"][0] == first
    (fake_host / "etc" / "hosts").write_text("127.0.0.1 localhost changed-size\n")
    store._etc_cache.clear()                                    # the signature is re-read at most once a second
    second = store.resolve("host").layers["/etc"][0]
    assert second != first and "changed-size" in Path(second, "hosts").read_text()
    assert Path(first).is_dir()                                 # running sandboxes keep their copy


def test_real_host_image(tmp_path):
    image = ImageStore(tmp_path / "state", podman="").resolve("host")
    assert {"/", "/usr", "/etc"} <= set(image.layers)
    etc = Path(image.layers["/etc"][0])
    assert (etc / "passwd").is_file() and not (etc / "shadow").exists() and not (etc / "gshadow").exists()
    assert not list(etc.glob("ssh/ssh_host_*_key*")) and not (etc / "ssl" / "private").exists()
    skel = Path(image.layers["/"][0])
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = Path("/") / name
        if host.is_symlink():
            assert os.readlink(skel / name) == os.readlink(host)
    assert os.listdir(skel / "root") == []
    lowers = [p for ps in image.layers.values() for p in ps]
    assert not any(p == "/work" or p.startswith("/work/") or p in ("/", "/root", "/home") for p in lowers)


# ---------------------------------------------------------------- directories and names
def test_directory_image(tmp_path):
    rootfs = tmp_path / "images" / "rootfs"
    (rootfs / "usr").mkdir(parents=True)
    store = ImageStore(tmp_path / "state", podman="", roots=[str(tmp_path / "images")])
    assert store.resolve(str(rootfs)) == Image(name=str(rootfs), layers={"/": [str(rootfs)]})
    (tmp_path / "images" / "empty").mkdir()
    for bad in (str(tmp_path / "images" / "empty"), str(tmp_path / "images" / "missing")):
        with pytest.raises(NotFoundError):
            store.resolve(bad)
    for outside in ("/", str(tmp_path), "/usr"):                # not under an allowed root
        with pytest.raises(RequestError):
            store.resolve(outside)
    with pytest.raises(RequestError):
        ImageStore(tmp_path / "state2", podman="").resolve(str(rootfs))   # no roots configured: refused


def test_unknown_name_lists_what_exists(tmp_path):
    store = ImageStore(tmp_path / "state", podman="")
    upper = tmp_path / "up"
    upper.mkdir()
    store.snapshot("snap-a", Image(name="host", layers={"/": [str(tmp_path)]}), {"/": str(upper)})
    with pytest.raises(NotFoundError) as e:
        store.resolve("nope")
    assert e.value.detail == "Unknown image 'nope'. Available: host, your snapshots"   # snapshots are per owner
    assert "snap-a" not in e.value.detail
    assert store.names() == ["host", "snap-a"]


def test_escape_is_injective_and_flat():
    names = ["a:b", "a/b", "a%3Ab", ".", "..", "/", "/usr", "x,y"]
    escaped = [escape(n) for n in names]
    assert len(set(escaped)) == len(names)
    assert not any(c in e for e in escaped for c in "/:,") and not any(e.startswith(".") for e in escaped)


# ---------------------------------------------------------------- snapshots
def make_upper(path: Path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    path.mkdir(exist_ok=True)
    return str(path)


def test_snapshot_manifest_and_stacking(tmp_path):
    store = ImageStore(tmp_path / "state", podman="")
    base = Image(name="host", layers={"/": ["/base/root"], "/usr": ["/usr"]}, workdir="/testbed", env={"A": "1"})
    up1 = make_upper(tmp_path / "up1", {"workspace/a.txt": "hello"})
    empty = make_upper(tmp_path / "empty", {})
    added = store.snapshot("task-1:ready", base, {"/": up1, "/usr": empty})
    assert added == 5
    home = tmp_path / "state" / "images" / "snapshots" / escape("task-1:ready")
    manifest = json.loads((home / "manifest.json").read_text())
    assert {k: manifest[k] for k in ("name", "base", "workdir", "env")} == {
        "name": "task-1:ready", "base": "host", "workdir": "/testbed", "env": {"A": "1"}}
    copy1 = str(home / "layers" / "1" / escape("/"))
    assert manifest["layers"] == {"/": [copy1, "/base/root"], "/usr": ["/usr"]}   # empty upper adds no layer
    assert Path(copy1, "workspace", "a.txt").read_text() == "hello"

    # a snapshot of a snapshot stacks on its layers (the base's lowers must exist to resolve it)
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    manifest["layers"] = {"/": [copy1, str(base_dir)]}
    (home / "manifest.json").write_text(json.dumps(manifest))
    first = store.resolve("task-1:ready")
    up2 = make_upper(tmp_path / "up2", {"b.txt": "bb"})
    store.snapshot("team/task-1:step2", first, {"/": up2})
    second = store.resolve("team/task-1:step2")
    assert second.layers["/"][1:] == [copy1, str(base_dir)] and len(second.layers["/"]) == 3
    assert ":" not in second.layers["/"][0]
    assert store.names() == ["host", "task-1:ready", "team/task-1:step2"]


def test_replacing_and_deleting_keep_layers_in_use(tmp_path):
    store = ImageStore(tmp_path / "state", podman="")
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    base = Image(name=str(base_dir), layers={"/": [str(base_dir)]})
    store.snapshot("s", base, {"/": make_upper(tmp_path / "u1", {"v": "1"})})
    v1 = store.resolve("s").layers["/"][0]
    store.snapshot("s", base, {"/": make_upper(tmp_path / "u2", {"v": "2"})})   # replace the name
    v2 = store.resolve("s").layers["/"][0]
    assert v1 != v2 and Path(v1, "v").read_text() == "1"        # a sandbox on v1 keeps running
    store.snapshot("child", store.resolve("s"), {"/": make_upper(tmp_path / "u3", {"w": "3"})})
    store.delete_snapshot("s", in_use=[v1])
    assert "s" not in store.names()
    assert Path(v1).is_dir() and Path(v2).is_dir()               # v1 in use, v2 under 'child'
    store.delete_snapshot("child", in_use=[v1])
    assert Path(v1).is_dir() and not Path(v2).exists()
    with pytest.raises(NotFoundError):
        store.delete_snapshot("s")
    store.prune(in_use=[])                                      # the last sandbox on v1 went away
    assert not (tmp_path / "state" / "images" / "snapshots" / "s").exists()


def test_prune_keeps_current_versions(tmp_path):
    store = ImageStore(tmp_path / "state", podman="")
    base = Image(name="b", layers={"/": [str(tmp_path)]})
    store.snapshot("s", base, {"/": make_upper(tmp_path / "u1", {"v": "1"})})
    old = store.resolve("s").layers["/"][0]
    store.snapshot("s", base, {"/": make_upper(tmp_path / "u2", {"v": "2"})})
    store.prune(in_use=[old])
    assert Path(old).is_dir()
    store.prune(in_use=[])
    assert not Path(old).exists() and Path(store.resolve("s").layers["/"][0]).is_dir()


@pytest.mark.skipif(not ROOT, reason="whiteouts and trusted xattrs need root")
def test_snapshot_keeps_whiteouts_and_opaque_dirs(tmp_path):
    upper = tmp_path / "upper"
    (upper / "opaque").mkdir(parents=True)
    os.setxattr(upper / "opaque", "trusted.overlay.opaque", b"y")
    os.mknod(upper / "deleted", stat.S_IFCHR, os.makedev(0, 0))
    store = ImageStore(tmp_path / "state", podman="")
    store.snapshot("w", Image(name="b", layers={"/": [str(tmp_path)]}), {"/": str(upper)})
    copy = Path(store.resolve("w").layers["/"][0])
    assert is_whiteout(copy / "deleted")
    assert os.getxattr(copy / "opaque", "trusted.overlay.opaque") == b"y"


# ---------------------------------------------------------------- real overlays
def in_mount_ns(script: str) -> str:
    done = subprocess.run(["unshare", "-m", "sh", "-ec", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(not ROOT or not shutil.which("unshare"), reason="needs root and unshare")
def test_snapshot_layers_mount_as_overlay_and_whiteouts_hide(tmp_path):
    base = tmp_path / "base"
    for rel in ("usr/keep", "usr/gone", "usr/d/old", "usr/later"):
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(rel)
    store = ImageStore(tmp_path / "state", podman="", roots=[str(tmp_path)])
    image = store.resolve(str(base))

    def run_sandbox(image: Image, commands: str) -> str:
        upper, work, merged = (tmp_path / f"{image.name.strip('/').replace('/', '_')}-{n}" for n in ("u", "w", "m"))
        for d in (upper, work, merged):
            d.mkdir()
        lowers = ":".join(image.layers["/"])
        in_mount_ns(f"mount -t overlay overlay -o lowerdir={lowers},upperdir={upper},workdir={work} {merged}\n"
                    f"cd {merged}\n{commands}")
        return str(upper)

    upper = run_sandbox(image, "rm usr/gone\nrm -r usr/d\nmkdir usr/d\necho new > usr/d/fresh\necho a > usr/added")
    store.snapshot("snap:1", image, {"/": upper})
    snap = store.resolve("snap:1")
    assert len(snap.layers["/"]) == 2

    def listing(image: Image) -> list[str]:
        merged = tmp_path / f"view-{escape(image.name)}"
        merged.mkdir()
        out = in_mount_ns(f"mount -t overlay overlay -o lowerdir={':'.join(image.layers['/'])} {merged}\n"
                          f"cd {merged} && find . -mindepth 1 | sort")
        return out.split()

    assert listing(snap) == ["./usr", "./usr/added", "./usr/d", "./usr/d/fresh", "./usr/keep", "./usr/later"]
    upper2 = run_sandbox(snap, "rm usr/keep usr/added")
    store.snapshot("snap:2", snap, {"/": upper2})
    snap2 = store.resolve("snap:2")
    assert len(snap2.layers["/"]) == 3
    assert listing(snap2) == ["./usr", "./usr/d", "./usr/d/fresh", "./usr/later"]


# ---------------------------------------------------------------- OCI via podman
FAKE_PODMAN = textwrap.dedent("""\
    #!/bin/sh
    # A scripted stand-in for podman (not installed on this machine): only the calls ImageStore makes.
    case "$1 $2" in
      "image exists") [ "$3" = "local/img:1" ] ;;
      "pull --quiet") echo "Error: initializing source docker://$3: no such host" >&2; exit 125 ;;
      "image mount") echo "$MERGED" ;;
      "image inspect") echo '[{"Config": {"WorkingDir": "/app", "Env": ["PATH=/x:/y", "A=b=c"]}}]' ;;
      "images --format") echo "local/img:1"; echo "<none>:<none>" ;;
      *) exit 2 ;;
    esac
""")


def test_oci_names_go_through_podman(tmp_path, monkeypatch):
    podman = tmp_path / "podman"
    podman.write_text(FAKE_PODMAN)
    podman.chmod(0o755)
    merged = tmp_path / "merged"
    merged.mkdir()
    monkeypatch.setenv("MERGED", str(merged))
    store = ImageStore(tmp_path / "state", podman=str(podman))
    image = store.resolve("local/img:1")
    assert image == Image(name="local/img:1", layers={"/": [str(merged)]}, workdir="/app",
                          env={"PATH": "/x:/y", "A": "b=c"})
    assert store.names() == ["host", "local/img:1"]
    with pytest.raises(NotFoundError) as e:
        store.resolve("nope:latest")
    assert "podman pull failed: Error: initializing source" in e.value.detail
    assert e.value.detail.endswith("Available: host, your snapshots, local OCI images: local/img:1")
