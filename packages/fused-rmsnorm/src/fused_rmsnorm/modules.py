"""Thin nn.Modules over ``fused_rmsnorm_linear`` that cache the folded weight W' = W * g.

The cache costs one extra copy of the weight on the device; it is rebuilt when ``weight`` or
``norm_weight`` changes (tracked by data_ptr and the autograd version counter, so optimizer steps,
``load_state_dict`` and ``with torch.no_grad(): p.mul_(...)`` are seen). Edits through ``.data``
bypass the version counter: call ``refold()`` after those.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .ops.rmsnorm_linear import fold_weight, fused_rmsnorm_linear, fused_rmsnorm_linear_folded


def _norm_params(rmsnorm: nn.Module) -> tuple[torch.Tensor | None, float | None]:
    """(weight, eps) of torch.nn.RMSNorm or an HF-style RMSNorm (weight + variance_epsilon / eps)."""
    w = getattr(rmsnorm, "weight", None)
    eps = getattr(rmsnorm, "variance_epsilon", None)
    if eps is None:
        eps = getattr(rmsnorm, "eps", None)
    if w is not None and w.dim() != 1:
        raise ValueError(f"rmsnorm.weight must be 1-D (normalise over the last dim only), got {tuple(w.shape)}")
    return w, eps


class _FoldCache:
    def __init__(self):
        self.key = None
        self.value = None

    def get(self, w_norm: torch.Tensor, w_lin: torch.Tensor) -> torch.Tensor:
        key = (w_norm.data_ptr(), w_norm._version, w_lin.data_ptr(), w_lin._version, w_lin.dtype, w_lin.device)
        if key != self.key or self.value is None:
            with torch.no_grad():
                self.value = fold_weight(w_norm.detach(), w_lin.detach())
            self.key = key
        return self.value

    def clear(self):
        self.key = self.value = None


class FusedRMSNormLinear(nn.Module):
    """y = Linear(RMSNorm(x)); parameters ``norm_weight`` (d_in,), ``weight`` (d_out, d_in), ``bias``."""

    def __init__(self, d_in: int, d_out: int, bias: bool = False, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        kw = {"device": device, "dtype": dtype}
        self.d_in, self.d_out, self.eps = d_in, d_out, float(eps)
        self.norm_weight = nn.Parameter(torch.ones(d_in, **kw))
        self.weight = nn.Parameter(torch.empty(d_out, d_in, **kw))
        self.bias = nn.Parameter(torch.empty(d_out, **kw)) if bias else None
        self._fold = _FoldCache()
        self.reset_parameters()

    def reset_parameters(self) -> None:  # same init as nn.Linear
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.d_in) if self.d_in > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def refold(self) -> None:
        self._fold.clear()

    def folded_weight(self) -> torch.Tensor:
        return self._fold.get(self.norm_weight, self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and not torch.compiler.is_compiling():
            return fused_rmsnorm_linear_folded(
                x, self.norm_weight, self.weight, self.folded_weight(), self.bias, self.eps
            )
        # CPU (the torch path never reads W') and torch.compile (fold inside the op, no Python cache)
        return fused_rmsnorm_linear(x, self.norm_weight, self.weight, self.bias, self.eps)

    @classmethod
    def from_modules(cls, rmsnorm: nn.Module, linear: nn.Linear) -> FusedRMSNormLinear:
        w, eps = _norm_params(rmsnorm)
        d_out, d_in = linear.weight.shape
        if w is not None and w.shape[0] != d_in:
            raise ValueError(f"rmsnorm has {w.shape[0]} features but linear expects in_features={d_in}")
        if eps is None:  # torch.nn.RMSNorm(eps=None) means finfo(dtype).eps
            eps = torch.finfo(linear.weight.dtype).eps
        m = cls(d_in, d_out, bias=linear.bias is not None, eps=eps, device=linear.weight.device,
                dtype=linear.weight.dtype)  # fmt: skip
        with torch.no_grad():
            m.weight.copy_(linear.weight)
            m.norm_weight.copy_(w if w is not None else torch.ones_like(m.norm_weight))
            if linear.bias is not None:
                m.bias.copy_(linear.bias)
        return m

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}, bias={self.bias is not None}, eps={self.eps}"


class FusedRMSNormMultiLinear(nn.Module):
    """One RMSNorm feeding several projections (q/k/v, gate/up) as ONE GEMM over the concatenated
    weight; ``forward`` returns a tuple of outputs (views into one buffer), one per projection."""

    def __init__(
        self, d_in: int, d_outs: Sequence[int], bias: bool = False, eps: float = 1e-6, device=None, dtype=None
    ):
        super().__init__()
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        if not d_outs or any(int(d) <= 0 for d in d_outs):
            raise ValueError(f"d_outs must be a non-empty list of positive sizes, got {list(d_outs)}")
        kw = {"device": device, "dtype": dtype}
        self.d_in, self.d_outs, self.eps = d_in, [int(d) for d in d_outs], float(eps)
        self.norm_weight = nn.Parameter(torch.ones(d_in, **kw))
        self.weight = nn.Parameter(torch.empty(sum(self.d_outs), d_in, **kw))
        self.bias = nn.Parameter(torch.zeros(sum(self.d_outs), **kw)) if bias else None
        self._fold = _FoldCache()
        for chunk in self.weight.data.split(self.d_outs):
            nn.init.kaiming_uniform_(chunk, a=math.sqrt(5))

    def refold(self) -> None:
        self._fold.clear()

    def folded_weight(self) -> torch.Tensor:
        return self._fold.get(self.norm_weight, self.weight)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.is_cuda and not torch.compiler.is_compiling():
            y = fused_rmsnorm_linear_folded(x, self.norm_weight, self.weight, self.folded_weight(), self.bias, self.eps)
        else:
            y = fused_rmsnorm_linear(x, self.norm_weight, self.weight, self.bias, self.eps)
        return tuple(y.split(self.d_outs, dim=-1))

    @classmethod
    def from_modules(cls, rmsnorm: nn.Module, linears: Sequence[nn.Linear]) -> FusedRMSNormMultiLinear:
        if not linears:
            raise ValueError("linears must contain at least one nn.Linear")
        w, eps = _norm_params(rmsnorm)
        d_in = linears[0].weight.shape[1]
        for i, lin in enumerate(linears):
            if lin.weight.shape[1] != d_in:
                raise ValueError(f"linears[{i}] has in_features={lin.weight.shape[1]}, expected {d_in}")
            if lin.weight.dtype != linears[0].weight.dtype or lin.weight.device != linears[0].weight.device:
                raise ValueError(f"linears[{i}] differs in dtype/device from linears[0]")
        if w is not None and w.shape[0] != d_in:
            raise ValueError(f"rmsnorm has {w.shape[0]} features but the linears expect in_features={d_in}")
        ref = linears[0].weight
        if eps is None:
            eps = torch.finfo(ref.dtype).eps
        has_bias = any(lin.bias is not None for lin in linears)
        m = cls(d_in, [lin.weight.shape[0] for lin in linears], bias=has_bias, eps=eps, device=ref.device,
                dtype=ref.dtype)  # fmt: skip
        with torch.no_grad():
            m.weight.copy_(torch.cat([lin.weight for lin in linears], 0))
            m.norm_weight.copy_(w if w is not None else torch.ones_like(m.norm_weight))
            if has_bias:  # projections without a bias get zeros
                m.bias.copy_(
                    torch.cat(
                        [
                            lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.weight.shape[0])
                            for lin in linears
                        ]
                    )  # fmt: skip
                )
        return m

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_outs={self.d_outs}, bias={self.bias is not None}, eps={self.eps}"
