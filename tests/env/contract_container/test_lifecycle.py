"""tests/env/contract/test_lifecycle.py against the container backend (see conftest.py)."""

from tests.env.contract.test_lifecycle import *  # noqa: F401,F403
