"""Who is calling: the owner of sandboxes created with a key, and whether it is an admin."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Caller:
    owner: str          # short hash of the key; "" when auth is off
    admin: bool = False

    def may_see(self, owner: str) -> bool:
        """A sandbox belongs to the key that created it; admins see all."""
        return self.admin or self.owner == owner


def owner_of(key: str) -> str:
    """Stable, non-reversible owner name for a key."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


ANONYMOUS = Caller(owner="", admin=True)
