"""The three kernel packages working together through ``llm_kernels`` on CPU: one pre-norm attention
sub-layer built from the public ops (fused RMSNorm+QKV, flash attention with GQA, int8 output
projection), checked against a float64 reference."""

from __future__ import annotations

import math

import llm_kernels
import torch


def test_three_ops_compose_into_an_attention_sublayer():
    g = torch.Generator().manual_seed(7)
    b, n, hidden, heads, kv_heads, hd = 2, 9, 48, 4, 2, 16
    x = torch.randn(b, n, hidden, generator=g)
    w_norm = 1.0 + 0.3 * torch.randn(hidden, generator=g)
    w_qkv = torch.randn((heads + 2 * kv_heads) * hd, hidden, generator=g) * hidden**-0.5
    w_o = torch.randn(hidden, heads * hd, generator=g) * (heads * hd) ** -0.5
    o_proj = torch.nn.Linear(heads * hd, hidden, bias=False)
    with torch.no_grad():
        o_proj.weight.copy_(w_o)
    o_int8 = llm_kernels.Int8Linear.from_float(o_proj)

    qkv = llm_kernels.fused_rmsnorm_linear(x, w_norm, w_qkv)
    q, k, v = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
    q = q.view(b, n, heads, hd).transpose(1, 2)
    k = k.view(b, n, kv_heads, hd).transpose(1, 2)
    v = v.view(b, n, kv_heads, hd).transpose(1, 2)
    attn = llm_kernels.flash_attn_forward(q, k, v, causal=True)
    out = o_int8(attn.transpose(1, 2).reshape(b, n, heads * hd))

    # float64 reference, same math, no llm_kernels
    xd = x.double()
    h = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * w_norm.double()
    qr, kr, vr = (h @ w_qkv.double().T).split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
    qr = qr.view(b, n, heads, hd).transpose(1, 2)
    kr = kr.view(b, n, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, 1)
    vr = vr.view(b, n, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, 1)
    s = (qr @ kr.transpose(-1, -2)) / math.sqrt(hd)
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attn_ref = s.softmax(-1) @ vr
    torch.testing.assert_close(attn.double(), attn_ref, rtol=1e-4, atol=1e-4)
    ref = attn_ref.transpose(1, 2).reshape(b, n, heads * hd) @ w_o.double().T
    assert out.shape == (b, n, hidden) and out.dtype == x.dtype
    # int8 W8A8 error: well under 3% of the output's RMS
    rel = (out.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
    assert 0 < rel < 0.03, rel
