"""Transformer parts composed from the kernels: a Llama-family attention block with a KV cache, an MLP block
and a decoder block that chains them. Each module is usable alone.

* The input RMSNorm is fused into the q/k/v projection (one ``FusedRMSNormMultiLinear``), and the
  post-attention RMSNorm into gate/up, so the normalised activations never round-trip through memory.
* GQA is native: the attention kernel takes ``Hkv < H`` heads for k/v, nothing is repeated.
* RoPE runs in torch with the Llama (``rotate_half``) convention and HF-compatible positions.
* :class:`KVCache` preallocates ``(B, Hkv, max_len, D)`` buffers. Because the kernel's causal mask is
  aligned bottom-right, a prefill (``Nq == Nk``), a chunked prefill and a decode step
  (``Nq == 1``) all call the kernel with ``causal=True``.

Inference first; training works through the kernels' autograd (attention backward is a kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flashattn_triton import flash_attn_forward
from fused_rmsnorm import FusedRMSNormMultiLinear
from torch import nn


class KVCache(nn.Module):
    """Preallocated key/value cache for ONE attention layer: buffers of shape ``(B, Hkv, max_len, D)``.

    :meth:`append` writes the new keys/values after the ``length`` already stored and returns views
    ``[:, :, :length]`` of the buffers (strided, no copy: the attention kernel reads any strides).
    Every sequence of the batch has the same length (no ragged batches: use
    ``flash_attn_varlen_forward`` for those).
    """

    def __init__(
        self,
        batch_size: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float16,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        shape = (batch_size, num_kv_heads, max_len, head_dim)
        # Non-persistent buffers: they follow .to()/.half() with the model but stay out of state_dict.
        self.register_buffer("k", torch.empty(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.empty(shape, dtype=dtype, device=device), persistent=False)
        self.length = 0

    @classmethod
    def for_layers(cls, num_layers: int, *args, **kwargs) -> nn.ModuleList:
        """One cache per layer, same arguments as the constructor."""
        return nn.ModuleList(cls(*args, **kwargs) for _ in range(num_layers))

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def reset(self) -> None:
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k``/``v`` of shape ``(B, Hkv, n, D)``; return all keys/values so far, ``(B, Hkv, length, D)``."""
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"{name} must be a 4-D tensor (B, Hkv, n, D), got {getattr(t, 'shape', type(t))}")
            b, h, _, d = t.shape
            if (b, h, d) != (self.k.shape[0], self.k.shape[1], self.k.shape[3]):
                raise ValueError(
                    f"{name} has shape {tuple(t.shape)}, cache holds (B={self.k.shape[0]}, Hkv={self.k.shape[1]}, "
                    f"D={self.k.shape[3]})"
                )
        if k.shape[2] != v.shape[2]:
            raise ValueError(f"k and v disagree on the number of new positions: {k.shape[2]} vs {v.shape[2]}")
        n = k.shape[2]
        if self.length + n > self.max_len:
            raise ValueError(f"KVCache overflow: {self.length} stored + {n} new > max_len {self.max_len}")
        self.k[:, :, self.length : self.length + n].copy_(k)
        self.v[:, :, self.length : self.length + n].copy_(v)
        self.length += n
        return self.k[:, :, : self.length], self.v[:, :, : self.length]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """Llama RoPE (``rotate_half`` pairing, ``inv_freq = theta^(-2i/D)``), computed like transformers does:
    angles in fp32, cos/sin cast to the activations' dtype before they are applied."""

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.theta = theta

    def cos_sin(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids`` (B, L) or (L,) -> cos, sin of shape (B or 1, L, D)."""
        if position_ids.dim() == 1:
            position_ids = position_ids[None]
        freqs = position_ids[..., None].float() * self.inv_freq.float().to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor):
        """Rotate ``q`` (B, H, L, D) and ``k`` (B, Hkv, L, D) for the given positions."""
        cos, sin = self.cos_sin(position_ids, q.dtype)
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _rmsnorm(dim: int, eps: float, device=None, dtype=None) -> nn.RMSNorm:
    return nn.RMSNorm(dim, eps=eps, device=device, dtype=dtype)


class LlamaAttentionBlock(nn.Module):
    """``o_proj(attn(rope(qkv(rmsnorm(x)))))`` for a Llama-family layer (the residual add is the caller's).

    ``forward(x, position_ids=None, kv_cache=None)``: ``x`` is ``(B, L, hidden)``; with a
    :class:`KVCache` the new keys/values are appended and the queries attend to everything cached
    (prefill and decode alike). ``position_ids`` default to ``cache.length + arange(L)``.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        *,
        rope_theta: float = 10000.0,
        eps: float = 1e-6,
        bias: bool = False,
        o_bias: bool | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        head_dim = head_dim or hidden_size // num_heads
        self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim = (
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
        )
        fk = {"device": device, "dtype": dtype}
        norm = _rmsnorm(hidden_size, eps, **fk)
        q = nn.Linear(hidden_size, num_heads * head_dim, bias=bias, **fk)
        k = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias, **fk)
        v = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias, **fk)
        self.qkv = FusedRMSNormMultiLinear.from_modules(norm, [q, k, v])
        self.rotary = RotaryEmbedding(head_dim, rope_theta)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias if o_bias is None else o_bias, **fk)

    @classmethod
    def from_modules(
        cls,
        norm: nn.Module,
        q_proj: nn.Linear,
        k_proj: nn.Linear,
        v_proj: nn.Linear,
        o_proj: nn.Linear,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int | None = None,
        rope_theta: float = 10000.0,
    ) -> LlamaAttentionBlock:
        """Build from existing modules (e.g. a transformers ``LlamaDecoderLayer``'s input_layernorm + self_attn)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.hidden_size = q_proj.in_features
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = head_dim or q_proj.out_features // num_heads
        self.qkv = FusedRMSNormMultiLinear.from_modules(norm, [q_proj, k_proj, v_proj])
        self.rotary = RotaryEmbedding(self.head_dim, rope_theta).to(q_proj.weight.device)
        self.o_proj = o_proj
        return self

    def forward(
        self,
        x: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        *,
        causal: bool = True,
    ) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"x must have shape (B, L, {self.hidden_size}), got {tuple(x.shape)}")
        bsz, n, _ = x.shape
        q, k, v = self.qkv(x)
        # (B, L, H*D) -> (B, H, L, D) views; the kernel reads the strides, RoPE materialises q/k.
        q = q.view(bsz, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if position_ids is None:
            start = kv_cache.length if kv_cache is not None else 0
            position_ids = torch.arange(start, start + n, device=x.device)
        q, k = self.rotary(q, k, position_ids)
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)
        out = flash_attn_forward(q, k, v, causal=causal)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, n, self.num_heads * self.head_dim))


class LlamaMLPBlock(nn.Module):
    """``down(silu(gate(rmsnorm(x))) * up(rmsnorm(x)))`` with the RMSNorm fused into gate/up (one GEMM pass)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        eps: float = 1e-6,
        bias: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        norm = _rmsnorm(hidden_size, eps, **fk)
        gate = nn.Linear(hidden_size, intermediate_size, bias=bias, **fk)
        up = nn.Linear(hidden_size, intermediate_size, bias=bias, **fk)
        self.gate_up = FusedRMSNormMultiLinear.from_modules(norm, [gate, up])
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **fk)

    @classmethod
    def from_modules(cls, norm: nn.Module, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear):
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.gate_up = FusedRMSNormMultiLinear.from_modules(norm, [gate_proj, up_proj])
        self.down_proj = down_proj
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x)
        return self.down_proj(F.silu(gate) * up)


class LlamaDecoderBlock(nn.Module):
    """A Llama decoder layer: ``h = x + attn(x); out = h + mlp(h)`` (both norms fused into their projections)."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        intermediate_size: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        *,
        rope_theta: float = 10000.0,
        eps: float = 1e-6,
        device=None,
        dtype=None,
    ):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.attn = LlamaAttentionBlock(
            hidden_size, num_heads, num_kv_heads, head_dim, rope_theta=rope_theta, eps=eps, **fk
        )
        self.mlp = LlamaMLPBlock(hidden_size, intermediate_size, eps=eps, **fk)

    @classmethod
    def from_hf(cls, layer: nn.Module, config=None) -> LlamaDecoderBlock:
        """Convert a transformers ``LlamaDecoderLayer`` (weights shared, not copied).

        ``config`` (the model's ``LlamaConfig``) supplies the RoPE theta; default 10000. Only the
        default RoPE type is reproduced (no scaling variants).
        """
        attn = layer.self_attn
        cfg = config if config is not None else getattr(attn, "config", None)
        theta = _rope_theta(cfg)
        heads = cfg.num_attention_heads if cfg is not None else attn.q_proj.out_features // attn.head_dim
        kv_heads = cfg.num_key_value_heads if cfg is not None else attn.k_proj.out_features // attn.head_dim
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.attn = LlamaAttentionBlock.from_modules(
            layer.input_layernorm,
            attn.q_proj,
            attn.k_proj,
            attn.v_proj,
            attn.o_proj,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=attn.head_dim,
            rope_theta=theta,
        )
        mlp = layer.mlp
        self.mlp = LlamaMLPBlock.from_modules(layer.post_attention_layernorm, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        return self

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None
    ) -> torch.Tensor:
        h = x + self.attn(x, position_ids, kv_cache)
        return h + self.mlp(h)


def _rope_theta(config) -> float:
    if config is None:
        return 10000.0
    params = getattr(config, "rope_parameters", None)  # transformers >= 5
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))
