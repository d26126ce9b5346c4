"""tests/env/contract/test_files.py against the container backend (see conftest.py)."""

from tests.env.contract.test_files import *  # noqa: F401,F403
