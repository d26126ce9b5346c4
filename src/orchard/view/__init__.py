"""The trajectory viewer: a web page over a rollout run's dataset (`orchard view DIR`)."""

from orchard.view.app import create_app

__all__ = ["create_app"]
