"""tests/env/contract/test_api.py against the container backend (see conftest.py)."""

from tests.env.contract.test_api import *  # noqa: F401,F403
