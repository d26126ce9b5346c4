"""A real Orchard Env service (local backend) for the task tests that need sandboxes."""

import pytest

from orchard.env.runner import ServiceProcess


@pytest.fixture(scope="session")
def env_url():
    with ServiceProcess(args=["--no-auth"]) as service:
        yield service.url


@pytest.fixture
def client(env_url):
    from orchard import SandboxClient

    with SandboxClient(base_url=env_url) as c:
        yield c
