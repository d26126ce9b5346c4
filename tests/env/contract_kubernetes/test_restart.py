"""tests/env/contract/test_restart.py against the Kubernetes backend on the fake API server (see conftest.py)."""

from tests.env.contract.test_restart import *  # noqa: F401,F403
