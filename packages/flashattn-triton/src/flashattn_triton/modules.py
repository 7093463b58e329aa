"""Thin nn.Module wrappers."""

from __future__ import annotations

import torch
from torch import nn

from .ops.flash_attn import flash_attn_forward


class FlashAttention(nn.Module):
    """Drop-in attention core: ``forward(q, k, v)`` with q ``(B, H, Nq, D)``, k/v ``(B, Hkv, Nk, D)``.

    ``causal`` is bottom-right aligned (see :func:`flashattn_triton.flash_attn_forward`).
    """

    def __init__(self, causal: bool = False, sm_scale: float | None = None):
        super().__init__()
        self.causal = bool(causal)
        self.sm_scale = sm_scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return flash_attn_forward(q, k, v, causal=self.causal, sm_scale=self.sm_scale)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, sm_scale={self.sm_scale}"
