"""Stores of sandbox records and job results: one file per alternative (sqlite.py embedded, redis.py shared)."""

from orchard.env.service.stores.base import Store, Turn
from orchard.env.service.stores.sqlite import SqliteStore

__all__ = ["Store", "Turn", "SqliteStore"]    # RedisStore: import orchard.env.service.stores.redis (needs `redis`)
