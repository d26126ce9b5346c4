"""Orchard Env: the sandbox service (server/, service/, backends/) and its wire contract (protocol.py)."""
