"""tests/env/contract/test_isolation.py against the container backend (see conftest.py)."""

from tests.env.contract.test_isolation import *  # noqa: F401,F403
