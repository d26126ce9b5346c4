"""Stores of sandbox records and job results: one file per alternative (sqlite.py embedded, redis.py later)."""

from orchard.env.service.stores.base import Store
from orchard.env.service.stores.sqlite import SqliteStore

__all__ = ["Store", "SqliteStore"]
