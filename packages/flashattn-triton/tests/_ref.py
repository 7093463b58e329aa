"""float64 reference attention with an explicit bottom-right causal mask (shared by the tests)."""

from __future__ import annotations

import torch


def ref_attention(q, k, v, causal=False, sm_scale=None, dtype=torch.float64):
    """Returns (out, lse) in ``dtype``; rows that see no key give out 0 and lse -inf."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    d = q.shape[-1]
    scale = d**-0.5 if sm_scale is None else sm_scale
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (nk - nq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    return torch.matmul(p, v), lse


def rand(*shape, dtype=torch.float16, device="cpu", requires_grad=False):
    t = torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)
    return t.requires_grad_(requires_grad)
