"""tests/env/contract/test_restart.py against the container backend (see conftest.py)."""

from tests.env.contract.test_restart import *  # noqa: F401,F403
