"""tests/env/contract/test_isolation.py against the Kubernetes backend on the fake API server (see conftest.py)."""

from tests.env.contract.test_isolation import *  # noqa: F401,F403
