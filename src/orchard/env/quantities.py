"""Parse Kubernetes-style CPU and memory quantities ('500m', '2', '512Mi', '1G')."""

from __future__ import annotations

import re

_MEMORY_UNITS = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}


def parse_cpu(text: str) -> float:
    """Cores from '4', '0.5' or '2000m'; ValueError when malformed or not positive."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)(m?)\s*", str(text))
    if not match:
        raise ValueError(f"invalid cpu quantity {text!r}: use N, N.M or Nm (millicores)")
    value = float(match.group(1)) / (1000 if match.group(2) else 1)
    if value <= 0:
        raise ValueError(f"cpu quantity must be positive, got {text!r}")
    return value


def parse_memory(text: str) -> int:
    """Bytes from '512Mi', '2G', '1.5Gi' or '1048576'; ValueError when malformed or not positive."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|k|M|G|T)?\s*", str(text))
    if not match:
        raise ValueError(f"invalid memory quantity {text!r}: use bytes or a suffix Ki Mi Gi Ti k M G T")
    value = int(float(match.group(1)) * _MEMORY_UNITS[match.group(2) or ""])
    if value <= 0:
        raise ValueError(f"memory quantity must be positive, got {text!r}")
    return value
