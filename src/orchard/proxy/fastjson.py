"""JSON for the proxy's hot path: orjson where it gives the same result as the standard library, the library elsewhere."""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

import orjson

_LENIENT: ContextVar[bool] = ContextVar("orchard_proxy_lenient_json", default=False)


def loads(data: bytes | str) -> Any:
    """Parse JSON; input orjson refuses but Python accepts (NaN, huge integers, lone surrogates) goes to ``json``."""
    return parse(data)[0]


def parse(data: bytes | str) -> tuple[Any, bool]:
    """The value, and whether it was strict JSON (then it holds no NaN or infinity and ``dumps`` may use orjson)."""
    try:
        return orjson.loads(data), True
    except orjson.JSONDecodeError:
        return json.loads(data), False


def dumps(value: Any, strict: bool = True) -> bytes:
    """Compact UTF-8 JSON. ``strict=False`` (the value may hold NaN or infinities, which orjson would write as null)
    uses ``json``, which writes them as Python does; so does a value orjson cannot encode (e.g. non-string keys)."""
    if strict and not _LENIENT.get():
        try:
            return orjson.dumps(value)
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


@contextmanager
def lenient() -> Iterator[None]:
    """Within this block every ``dumps`` writes as the standard library does (a reply rendered from a request that was
    not strict JSON may echo its NaN)."""
    token = _LENIENT.set(True)
    try:
        yield
    finally:
        _LENIENT.reset(token)


def finite(values: Any) -> bool:
    """Whether a list of floats holds neither NaN nor an infinity (one C-level sum instead of a Python loop)."""
    if not values:
        return True
    try:
        return math.isfinite(sum(values))
    except TypeError:
        return False
