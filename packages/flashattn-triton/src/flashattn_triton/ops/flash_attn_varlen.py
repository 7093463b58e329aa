"""Varlen attention over packed sequences (FlashAttention's ``cu_seqlens`` convention).

q ``(total_q, H, D)``, k/v ``(total_k, Hkv, D)``; sequence ``b`` owns rows
``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of q and ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` of k/v. The
kernels are the ones of :mod:`flashattn_triton.ops.flash_attn` with ``VARLEN`` set; causal masking
is bottom-right aligned per sequence. Forward and backward; LSE is ``(H, total_q)`` fp32.
"""

from __future__ import annotations

import torch

from .._common import Backend, check_same_device, check_tensor, select_backend, use_registered_op
from .flash_attn import (
    SUPPORTED_DTYPES,
    _backward_launch,
    _check_head_dim,
    _check_scale,
    _fwd_launch,
    _torch_backward,
    _torch_forward,
    _unit_last,
    get_config,
)


def check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dtypes=SUPPORTED_DTYPES, rank=3)
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_tensor(name, t, dtypes=(torch.int32, torch.int64), rank=1)
    device = check_same_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    select_backend(device)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"k and v must have the dtype of q ({q.dtype}), got k {k.dtype}, v {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    H, D = q.shape[1], q.shape[2]
    Hkv = k.shape[1]
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"q heads ({H}) must be a multiple of k/v heads ({Hkv})")
    if k.shape[2] != D:
        raise ValueError(f"k head dim {k.shape[2]} does not match q head dim {D}")
    _check_head_dim(D)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel() or cu_seqlens_q.numel() < 2:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must have the same length >= 2, got {cu_seqlens_q.numel()} "
            f"and {cu_seqlens_k.numel()}"
        )
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"{name} must be a positive int, got {m!r}")
    return device, _check_scale(sm_scale, D)


def _segments(cu_q, cu_k):
    cq, ck = cu_q.tolist(), cu_k.tolist()
    return [(cq[i], cq[i + 1], ck[i], ck[i + 1]) for i in range(len(cq) - 1)]


def _torch_varlen_forward(q, k, v, cu_q, cu_k, causal, sm_scale):
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    for q0, q1, k0, k1 in _segments(cu_q, cu_k):
        if q1 == q0:
            continue
        if k1 == k0:  # nothing to attend to: zeros, lse -inf (as the kernel)
            continue
        o, l = _torch_forward(
            q[q0:q1].transpose(0, 1)[None],
            k[k0:k1].transpose(0, 1)[None],
            v[k0:k1].transpose(0, 1)[None],
            causal,
            sm_scale,
        )
        out[q0:q1] = o[0].transpose(0, 1)
        lse[:, q0:q1] = l[0]
    return out, lse


def _torch_varlen_backward(do, q, k, v, out, lse, cu_q, cu_k, causal, sm_scale):
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for q0, q1, k0, k1 in _segments(cu_q, cu_k):
        if q1 == q0 or k1 == k0:
            continue
        t = lambda x, a, b: x[a:b].transpose(0, 1)[None]
        g = _torch_backward(
            t(do, q0, q1),
            t(q, q0, q1),
            t(k, k0, k1),
            t(v, k0, k1),
            t(out, q0, q1),
            lse[:, q0:q1][None],
            None,
            causal,
            sm_scale,
        )
        dq[q0:q1] = g[0][0].transpose(0, 1)
        dk[k0:k1] = g[1][0].transpose(0, 1)
        dv[k0:k1] = g[2][0].transpose(0, 1)
    return dq, dk, dv


def _varlen_forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale):
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    if select_backend(q.device) == Backend.TORCH:
        return _torch_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, sm_scale)
    out = torch.empty_like(q)
    lse = torch.empty((q.shape[1], q.shape[0]), device=q.device, dtype=torch.float32)
    cu_q, cu_k = cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32)
    launch = lambda c: _fwd_launch(q, k, v, out, lse, causal, sm_scale, c, cu_q, cu_k, max_seqlen_q, max_seqlen_k)
    launch(get_config("fwd", q.device, q.shape[2], causal, max(max_seqlen_q, max_seqlen_k), q.dtype, launch))
    return out, lse


@torch.library.custom_op("flashattn_triton::flash_attn_varlen_fwd", mutates_args=())
def flash_attn_varlen_fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _varlen_forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale)


@flash_attn_varlen_fwd_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _varlen_backward_impl(
    do, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale
):
    do, q, k, v, out = (_unit_last(t) for t in (do, q, k, v, out))
    if select_backend(q.device) == Backend.TORCH:
        if dlse is not None:
            raise NotImplementedError("LSE gradient on the varlen CPU reference path")
        return _torch_varlen_backward(do, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal, sm_scale)
    dq = torch.empty_like(q)
    # keys that no sequence owns (past cu_seqlens_k[-1]) are never written by the kernel
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    cu_q, cu_k = cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32)
    lse = lse.contiguous()
    dlse = dlse.contiguous() if dlse is not None else None
    launch = lambda c: _backward_launch(
        do, q, k, v, out, lse, dlse, dq, dk, dv, causal, sm_scale, c, cu_q, cu_k, max_seqlen_q, max_seqlen_k
    )
    launch(get_config("bwd", q.device, q.shape[2], causal, max(max_seqlen_q, max_seqlen_k), q.dtype, launch))
    return dq, dk, dv


@torch.library.custom_op("flashattn_triton::flash_attn_varlen_bwd", mutates_args=())
def flash_attn_varlen_bwd_op(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dlse: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _varlen_backward_impl(
        do, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale
    )


@flash_attn_varlen_bwd_op.register_fake
def _(do, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, sm_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, sm_scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.args = (max_q, max_k, causal, sm_scale)
    ctx.set_materialize_grads(False)  # an unused LSE: dlse None, not zeros (see flash_attn._setup_context)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    # eager: the implementation directly (as flash_attn._backward); tracing and dispatch modes: the op
    tensors = (dout, q, k, v, out, lse, dlse, cu_q, cu_k)
    bwd = flash_attn_varlen_bwd_op if use_registered_op(*tensors) else _varlen_backward_impl
    dq, dk, dv = bwd(*tensors, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


flash_attn_varlen_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def flash_attn_varlen_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    sm_scale: float | None = None,
    return_lse: bool = False,
):
    """Attention over packed variable-length sequences; differentiable in q, k, v.

    ``cu_seqlens_*`` are int32/int64 ``(batch + 1,)`` prefix sums starting at 0; ``max_seqlen_*`` bound
    each sequence's length (they size the grid). Returns ``out`` ``(total_q, H, D)`` and, with
    ``return_lse``, the natural-log LSE ``(H, total_q)`` fp32.
    """
    _, scale = check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    fwd = flash_attn_varlen_fwd_op if needs_grad or use_registered_op(q, k, v) else _varlen_forward_impl
    out, lse = fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), bool(causal), scale)
    return (out, lse) if return_lse else out
