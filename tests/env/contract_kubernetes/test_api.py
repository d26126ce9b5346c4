"""tests/env/contract/test_api.py against the Kubernetes backend on the fake API server (see conftest.py)."""

from tests.env.contract.test_api import *  # noqa: F401,F403
