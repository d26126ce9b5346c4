"""tests/env/contract/test_pty_snapshot.py against the container backend (see conftest.py)."""

from tests.env.contract.test_pty_snapshot import *  # noqa: F401,F403
