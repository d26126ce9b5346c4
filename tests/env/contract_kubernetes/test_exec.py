"""tests/env/contract/test_exec.py against the Kubernetes backend on the fake API server (see conftest.py)."""

from tests.env.contract.test_exec import *  # noqa: F401,F403
