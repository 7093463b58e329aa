"""Thin nn.Module wrappers."""

from __future__ import annotations

import torch
from torch import nn

from .ops.linear import int8_linear
from .ops.quantize import quantize_symmetric


class Int8Linear(nn.Module):
    """W8A8 linear layer: int8 weight (per output channel scales), int8 activations (per token).

    The weight is stored as an ``(out_features, in_features)`` contiguous int8 buffer (K-major,
    the GEMM's fast layout) with ``weight_scale`` (out_features,) fp32. Forward quantizes the
    activations per token, runs the int8 GEMM with dequant (+bias) fused and returns the input
    dtype (or ``out_dtype`` when given). Inference only: no autograd.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        out_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.out_dtype = out_dtype
        self.register_buffer("weight", torch.zeros((out_features, in_features), dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.ones((out_features,), dtype=torch.float32, device=device))
        if bias:
            self.register_buffer("bias", torch.zeros((out_features,), dtype=torch.float32, device=device))
        else:
            self.bias = None

    @classmethod
    @torch.no_grad()
    def from_float(cls, linear: nn.Linear, out_dtype: torch.dtype | None = None) -> Int8Linear:
        """Quantize ``linear``'s weight per output channel once (symmetric, RNE, [-127, 127])."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        mod = cls(linear.in_features, linear.out_features, linear.bias is not None, out_dtype, device=w.device)
        w_q, w_s = quantize_symmetric(w.float() if w.dtype not in (torch.float16, torch.bfloat16) else w, dim=-1)
        mod.weight.copy_(w_q)
        mod.weight_scale.copy_(w_s.view(-1))
        if linear.bias is not None:
            mod.bias.copy_(linear.bias.detach().float())
        return mod

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return int8_linear(x, self.weight, self.weight_scale, self.bias, self.out_dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
