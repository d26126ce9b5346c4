"""tests/env/contract/test_exec.py against the container backend (see conftest.py)."""

from tests.env.contract.test_exec import *  # noqa: F401,F403
