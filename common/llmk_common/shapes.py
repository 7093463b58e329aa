"""Integer shape arithmetic shared by the launchers' planners."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b without going through floats (exact for any Python int)."""
    return -(-a // b)
