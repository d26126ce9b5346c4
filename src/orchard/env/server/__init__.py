"""The HTTP face of Orchard Env: create_app(settings) builds the ASGI app."""

from orchard.env.server.app import create_app

__all__ = ["create_app"]
