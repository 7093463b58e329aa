"""Argument checks that name the offending argument in their message."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    name: str,
    t: object,
    *,
    dtypes: Iterable[torch.dtype] | None = None,
    rank: int | None = None,
    min_rank: int | None = None,
    ranks: Iterable[int] | None = None,
) -> torch.Tensor:
    """Raise TypeError/ValueError naming ``name`` when ``t`` is not an acceptable tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            raise TypeError(f"{name} must have dtype in ({_dtype_names(dtypes)}), got {t.dtype}")
    if rank is not None and t.dim() != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {tuple(t.shape)}")
    if min_rank is not None and t.dim() < min_rank:
        raise ValueError(f"{name} must have rank >= {min_rank}, got shape {tuple(t.shape)}")
    if ranks is not None:
        ranks = tuple(ranks)
        if t.dim() not in ranks:
            raise ValueError(f"{name} must have rank in {ranks}, got shape {tuple(t.shape)}")
    return t


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    """All given tensors must live on one device; returns it. ``None`` entries are skipped."""
    device = None
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError(f"{name} is on {t.device} but {first} is on {device}; all tensors must share a device")
    if device is None:
        raise ValueError("no tensor given")
    return device
