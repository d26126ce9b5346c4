"""tests/env/contract/test_files.py against the Kubernetes backend on the fake API server (see conftest.py)."""

from tests.env.contract.test_files import *  # noqa: F401,F403
