"""The package surface: a light import, a complete ``__all__``, and a docstring on every public method."""

import inspect
import os
import subprocess
import sys
from pathlib import Path

import orchard
import orchard.client
from orchard import errors

SRC = str(Path(__file__).resolve().parents[2] / "src")
HEAVY = ("fastapi", "starlette", "uvicorn", "torch", "websockets")


def test_import_is_light():
    check = f"import orchard, sys; heavy = [m for m in {HEAVY!r} if m in sys.modules]; assert not heavy, heavy"
    done = subprocess.run([sys.executable, "-c", check], env={**os.environ, "PYTHONPATH": SRC},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _public(module) -> set[str]:
    return {name for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value)}


def test_all_is_complete():
    assert set(orchard.__all__) == _public(orchard)
    assert all(hasattr(orchard, name) for name in orchard.__all__)
    assert set(orchard.client.__all__) == _public(orchard.client)
    assert orchard.__version__ == "0.1.0"


def test_every_error_class_is_exported():
    classes = {name for name, value in vars(errors).items()
               if inspect.isclass(value) and issubclass(value, errors.OrchardError)}
    assert classes <= set(orchard.__all__)


def test_sync_and_async_twins_match():
    pairs = [(orchard.SandboxClient, orchard.AsyncSandboxClient),
             (orchard.SandboxInstance, orchard.AsyncSandboxInstance),
             (orchard.client.PtyProcess, orchard.client.AsyncPtyProcess)]
    for sync_cls, async_cls in pairs:
        sync_api, async_api = _api(sync_cls), _api(async_cls)
        assert sync_api.keys() == async_api.keys(), sync_cls
        for name in sync_api:
            assert list(sync_api[name].parameters) == list(async_api[name].parameters), (sync_cls, name)


def _api(cls) -> dict:
    return {name: inspect.signature(getattr(cls, name)) for name, value in vars(cls).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, classmethod))}


def test_client_signature_matches_the_spec():
    for cls in (orchard.SandboxClient, orchard.AsyncSandboxClient):
        params = inspect.signature(cls).parameters
        assert list(params)[:5] == ["base_url", "timeout", "auto_cleanup", "api_key", "prefix"]
        assert params["timeout"].default == 1200 and params["auto_cleanup"].default is True


def test_every_function_has_a_docstring():
    from orchard.client import aio, base, pty, results, sync
    missing = []
    for module in (aio, base, pty, results, sync):
        for name, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not value.__doc__:
                missing.append(f"{module.__name__}.{name}")
            if inspect.isclass(value) and value.__module__ == module.__name__:
                missing += _undocumented(value)
    assert not missing


def _undocumented(cls) -> list[str]:
    missing = [] if cls.__doc__ else [cls.__name__]
    for name, value in vars(cls).items():
        func = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        func = func.fget if isinstance(func, property) else func
        if inspect.isfunction(func) and not (name.startswith("__") and name.endswith("__")) and not func.__doc__:
            missing.append(f"{cls.__name__}.{name}")
    return missing
