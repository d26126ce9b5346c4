"""tests/env/contract/test_lifecycle.py against the Kubernetes backend on the fake API server (see conftest.py)."""

from tests.env.contract.test_lifecycle import *  # noqa: F401,F403
