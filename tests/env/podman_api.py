"""A Podman API service for tests of the container backend: a private socket, the default image storage.

Images live in Podman's default storage (the host image and the busybox image are built there once and
reused), so containers are told apart by the ``orchard.namespace`` label each test service sets to a
fresh value; at the end every container carrying it is removed, whatever the tests left behind.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest


@dataclass
class Engine:
    """A running Podman API service and what tests need to know of it."""

    url: str
    namespace: str                  # ORCHARD_NAMESPACE of the services under test: labels their containers
    host_image: str                 # the container backend's `host` image, prebuilt
    disk_quota: bool                # the storage can cap a container's writable layer


def podman_engine() -> Iterator[Engine]:
    """Start `podman system service` on a private socket; yield it; remove the containers it ran."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman runc, or `make install`)")
    docker = pytest.importorskip("docker", reason="the container backend needs the docker package (pip install docker)")
    from orchard.env.backends.container_images import ensure_host_image
    from orchard.env.podman import PodmanService

    folder = Path(tempfile.mkdtemp(prefix="orchard-podman-"))
    service = PodmanService(str(folder / "api.sock")).start()
    api = docker.APIClient(base_url=service.url, timeout=300)
    namespace = f"orchard-test-{secrets.token_hex(4)}"
    started = time.time()
    try:
        yield Engine(url=service.url, namespace=namespace, host_image=ensure_host_image(api),
                     disk_quota=_disk_quota(api))
    finally:
        for c in api.containers(all=True, filters={"label": f"orchard.namespace={namespace}"}):
            api.remove_container(c["Id"], force=True, v=True)
        _remove_snapshots(api, since=started)
        api.close()
        service.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _remove_snapshots(api, since: float) -> None:
    """Snapshot images committed during the run (the service's snapshots live in the shared storage)."""
    import docker.errors

    from orchard.env.backends.container_images import SNAPSHOT_REPOSITORY

    for image in api.images():
        tags = image.get("RepoTags") or []
        if image.get("Created", 0) >= since - 1 and any(t.startswith(SNAPSHOT_REPOSITORY + "/") for t in tags):
            try:
                api.remove_image(image["Id"], force=True)
            except docker.errors.APIError:
                pass                  # in use by someone else's container: theirs to remove


def _disk_quota(api) -> bool:
    """Whether this storage accepts a size for a container's writable layer (overlay on xfs with pquota, btrfs, ...)."""
    import docker.errors

    from orchard.env.podman import ensure_busybox_image

    image = ensure_busybox_image()
    if image is None:
        return False
    try:
        c = api.create_container(image, ["true"], host_config=api.create_host_config(storage_opt={"size": "64M"}))
    except docker.errors.APIError:
        return False
    api.remove_container(c["Id"], force=True)
    return True
