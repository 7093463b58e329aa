"""llm_kernels.modules vs a plain float64 torch reference: GQA, RoPE, KV-cache prefill/decode, MLP, decoder block."""

from __future__ import annotations

import math

import pytest
import torch
from llm_kernels.modules import KVCache, LlamaAttentionBlock, LlamaDecoderBlock, LlamaMLPBlock, RotaryEmbedding

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 4, 2, 16, 96


# ---------------------------------------------------------------- float64 reference (no llm_kernels code)


def _ref_rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _ref_rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d))
    ang = pos.double()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _ref_attention_block(x, p, pos, theta=10000.0, eps=1e-6, heads=HEADS, kv_heads=KV_HEADS):
    """x (B, L, hidden) float64; p: dict of float64 weights; full causal attention over L with GQA."""
    b, n, _ = x.shape
    hd = p["q"].shape[0] // heads
    h = _ref_rmsnorm(x, p["norm"], eps)
    q = (h @ p["q"].T).view(b, n, heads, hd).transpose(1, 2)
    k = (h @ p["k"].T).view(b, n, kv_heads, hd).transpose(1, 2)
    v = (h @ p["v"].T).view(b, n, kv_heads, hd).transpose(1, 2)
    q, k = _ref_rope(q, pos, theta), _ref_rope(k, pos, theta)
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(hd)
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, heads * hd)
    return o @ p["o"].T


def _ref_mlp(x, p, eps=1e-6):
    h = _ref_rmsnorm(x, p["norm2"], eps)
    return (torch.nn.functional.silu(h @ p["gate"].T) * (h @ p["up"].T)) @ p["down"].T


# ---------------------------------------------------------------- helpers


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Fresh non-trivial weights everywhere, norm weights included (they start as ones)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)


def _make_attn(
    seed=0, theta=10000.0, dtype=torch.float32, device="cpu", hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, hd=HEAD_DIM
) -> tuple[LlamaAttentionBlock, dict]:
    """A block built from known modules, and those modules' weights in float64 for the reference."""
    fk = {"device": device, "dtype": dtype}
    norm = torch.nn.RMSNorm(hidden, eps=1e-6, **fk)
    q = torch.nn.Linear(hidden, heads * hd, bias=False, **fk)
    k = torch.nn.Linear(hidden, kv_heads * hd, bias=False, **fk)
    v = torch.nn.Linear(hidden, kv_heads * hd, bias=False, **fk)
    o = torch.nn.Linear(heads * hd, hidden, bias=False, **fk)
    for i, m in enumerate((norm, q, k, v, o)):
        _randomize(m, 100 * seed + i)
    ref = {"norm": norm.weight, "q": q.weight, "k": k.weight, "v": v.weight, "o": o.weight}
    ref = {n: w.detach().double().clone() for n, w in ref.items()}
    block = LlamaAttentionBlock.from_modules(
        norm, q, k, v, o, num_heads=heads, num_kv_heads=kv_heads, head_dim=hd, rope_theta=theta
    )
    return block, ref


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_attention_block_matches_reference_gqa(theta):
    block, ref = _make_attn(seed=1, theta=theta)
    x = torch.randn(2, 7, HIDDEN)
    with torch.no_grad():
        out = block(x)
    want = _ref_attention_block(x.double(), ref, torch.arange(7), theta=theta)
    assert out.shape == (2, 7, HIDDEN) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)


def test_attention_block_constructor_and_bias():
    torch.manual_seed(3)
    block = LlamaAttentionBlock(HIDDEN, HEADS, KV_HEADS, rope_theta=10000.0, bias=True)
    _randomize(block, 3)
    x = torch.randn(1, 5, HIDDEN)
    with torch.no_grad():
        out = block(x)
    assert out.shape == (1, 5, HIDDEN) and torch.isfinite(out).all()
    # changing a later token must not change earlier outputs (causal)
    x2 = x.clone()
    x2[:, -1] += 1.0
    with torch.no_grad():
        out2 = block(x2)
    torch.testing.assert_close(out2[:, :-1], out[:, :-1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out2[:, -1], out[:, -1])
    with pytest.raises(ValueError, match="num_kv_heads"):
        LlamaAttentionBlock(HIDDEN, 4, 3)
    with pytest.raises(ValueError, match="x must have shape"):
        block(torch.randn(5, HIDDEN))


def test_kv_cache_prefill_chunk_decode_match_full_recompute():
    block, ref = _make_attn(seed=2)
    total = 11
    x = torch.randn(2, total, HIDDEN)
    full = _ref_attention_block(x.double(), ref, torch.arange(total))
    cache = KVCache(2, KV_HEADS, 16, HEAD_DIM, dtype=torch.float32)
    # poison the buffers: any read of an unwritten slot would show up as NaN
    cache.k.fill_(float("nan"))
    cache.v.fill_(float("nan"))
    outs = []
    with torch.no_grad():
        outs.append(block(x[:, :6], kv_cache=cache))  # prefill 6
        outs.append(block(x[:, 6:8], kv_cache=cache))  # chunked prefill 2 (Nq < Nk, bottom-right causal)
        for t in range(8, total):  # decode one token at a time
            outs.append(block(x[:, t : t + 1], kv_cache=cache))
    assert cache.length == total
    got = torch.cat(outs, dim=1)
    torch.testing.assert_close(got.double(), full, rtol=1e-4, atol=1e-4)


def test_kv_cache_errors_and_reset():
    cache = KVCache(1, 2, 4, 8, dtype=torch.float32)
    k = torch.randn(1, 2, 3, 8)
    kk, vv = cache.append(k, k + 1)
    assert kk.shape == (1, 2, 3, 8) and torch.equal(kk, k) and torch.equal(vv, k + 1)
    with pytest.raises(ValueError, match="overflow"):
        cache.append(k, k)
    with pytest.raises(ValueError, match="k has shape"):
        cache.append(torch.randn(1, 3, 1, 8), torch.randn(1, 3, 1, 8))
    with pytest.raises(ValueError, match="disagree"):
        cache.append(torch.randn(1, 2, 1, 8), torch.randn(1, 2, 2, 8))
    cache.reset()
    assert cache.length == 0
    caches = KVCache.for_layers(3, 1, 2, 4, 8)
    assert len(caches) == 3 and caches[0].k.data_ptr() != caches[1].k.data_ptr()


def test_explicit_position_ids_match_default():
    block, _ = _make_attn(seed=4)
    x = torch.randn(1, 6, HIDDEN)
    with torch.no_grad():
        a = block(x)
        b = block(x, position_ids=torch.arange(6)[None])
        c = block(x, position_ids=torch.arange(3, 9))  # shifted positions: RoPE is relative, so same scores
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


def test_rotary_matches_reference_and_rejects_odd_dim():
    rope = RotaryEmbedding(HEAD_DIM, theta=10000.0)
    q = torch.randn(2, HEADS, 5, HEAD_DIM)
    k = torch.randn(2, KV_HEADS, 5, HEAD_DIM)
    pos = torch.tensor([3, 4, 5, 6, 7])
    qr, kr = rope(q, k, pos)
    torch.testing.assert_close(qr.double(), _ref_rope(q.double(), pos, 10000.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kr.double(), _ref_rope(k.double(), pos, 10000.0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(15)


def test_mlp_block_matches_reference():
    torch.manual_seed(5)
    norm = torch.nn.RMSNorm(HIDDEN, eps=1e-6)
    gate, up = torch.nn.Linear(HIDDEN, INTER, bias=False), torch.nn.Linear(HIDDEN, INTER, bias=False)
    down = torch.nn.Linear(INTER, HIDDEN, bias=False)
    for i, m in enumerate((norm, gate, up, down)):
        _randomize(m, 50 + i)
    p = {"norm2": norm.weight, "gate": gate.weight, "up": up.weight, "down": down.weight}
    p = {n: w.detach().double().clone() for n, w in p.items()}
    mlp = LlamaMLPBlock.from_modules(norm, gate, up, down)
    x = torch.randn(3, 5, HIDDEN)
    with torch.no_grad():
        out = mlp(x)
    torch.testing.assert_close(out.double(), _ref_mlp(x.double(), p), rtol=1e-4, atol=1e-4)
    fresh = LlamaMLPBlock(HIDDEN, INTER)
    assert fresh(x).shape == x.shape


def test_decoder_block_residuals_and_cache():
    torch.manual_seed(6)
    blk = LlamaDecoderBlock(HIDDEN, HEADS, INTER, KV_HEADS)
    _randomize(blk, 6)
    x = torch.randn(1, 7, HIDDEN)
    with torch.no_grad():
        full = blk(x)
        h = x + blk.attn(x)
        want = h + blk.mlp(h)
        cache = KVCache(1, KV_HEADS, 8, HEAD_DIM, dtype=torch.float32)
        step = torch.cat(
            [blk(x[:, :4], kv_cache=cache)] + [blk(x[:, t : t + 1], kv_cache=cache) for t in range(4, 7)], 1
        )
    torch.testing.assert_close(full, want)
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-4)


def test_attention_block_backward_reaches_inputs():
    """Training goes through flash_attn_forward's autograd: grads of x and o_proj match the reference."""
    block, ref = _make_attn(seed=7)
    x = torch.randn(1, 5, HIDDEN, dtype=torch.float32, requires_grad=True)
    g = torch.randn(1, 5, HIDDEN)
    (block(x) * g).sum().backward()
    xr = x.detach().double().requires_grad_(True)
    ref["o"].requires_grad_(True)
    (_ref_attention_block(xr, ref, torch.arange(5)) * g.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(block.o_proj.weight.grad.double(), ref["o"].grad, rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------- GPU (real sizes)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_attention_block_prefill_and_decode(dtype):
    """Llama-3-8B-like head layout (hidden 2048 here), 290-token prefill + 10 decode steps vs float64."""
    hidden, heads, kv_heads, hd = 2048, 16, 4, 128
    block, ref = _make_attn(
        seed=9, theta=500000.0, dtype=dtype, device="cuda", hidden=hidden, heads=heads, kv_heads=kv_heads, hd=hd
    )
    x = torch.randn(2, 300, hidden, device="cuda", dtype=dtype)
    cache = KVCache(2, kv_heads, 512, hd, dtype=dtype, device="cuda")
    with torch.no_grad():
        full = block(x)
        parts = [block(x[:, :290], kv_cache=cache)] + [block(x[:, t : t + 1], kv_cache=cache) for t in range(290, 300)]
    want = _ref_attention_block(
        x.double(), ref, torch.arange(300, device="cuda"), theta=500000.0, heads=heads, kv_heads=kv_heads
    )
    tol = 3e-2 if dtype == torch.float16 else 1e-1
    torch.testing.assert_close(full.double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(torch.cat(parts, 1).double(), want, rtol=tol, atol=tol)
