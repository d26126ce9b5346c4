"""tests/env/contract/test_pty_snapshot.py against the Kubernetes backend on the fake API server (see conftest.py)."""

from tests.env.contract.test_pty_snapshot import *  # noqa: F401,F403
