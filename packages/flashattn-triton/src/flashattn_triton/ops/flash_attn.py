"""FlashAttention-2-style attention: forward, backward, split-KV decode, shared with the varlen op.

Conventions used by every kernel here:

* scores live in base 2: ``s2 = (q . k) * sm_scale * log2(e)``, so softmax uses ``exp2``; the
  public LSE is natural-log fp32 (``lse = lse2 * ln 2``).
* causal masking is aligned bottom-right: query ``i`` sees key ``j`` iff ``j <= i + Nk - Nq``
  (FlashAttention >= 2.1). Rows that see no key at all (only possible when ``Nq > Nk``) return 0
  and LSE ``-inf``; their gradients are 0.
* every tensor is addressed through its strides (int64 offsets), so ``(B, N, H, D)`` storage
  viewed as ``(B, H, N, D)`` works without a copy.
* varlen shares the same kernels: with ``VARLEN`` the batch index selects a packed sequence via
  ``cu_seqlens`` and the batch stride is unused.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors (Triton >= 3.4); without them decode/backward keep pointer loads
    from triton.tools.tensor_descriptor import TensorDescriptor as _TensorDescriptor
except ImportError:  # pragma: no cover
    _TensorDescriptor = None

from .._common import (
    Backend,
    TuningTable,
    arch_key,
    capability,
    check_same_device,
    check_tensor,
    select_backend,
    use_registered_op,
)
from .._common.device import num_sms
from . import _bwd_sm90, _fwd_sm90

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256

# Split-KV decode is used for Nq <= DECODE_MAX_NQ when Nk >= DECODE_MIN_NK and the regular grid
# would leave the GPU mostly idle. Module-level so tests can force the path on tiny shapes.
DECODE_MAX_NQ = 16
DECODE_MIN_NK = 512

_TUNING = TuningTable.from_json(Path(__file__).resolve().parent.parent / "tuning.json")


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------


@triton.jit
def _seq_bounds(cu_seqlens, b, n, VARLEN: tl.constexpr):
    """(start offset, length) of batch entry ``b``: packed sequence for varlen, else (0, n)."""
    if VARLEN:
        start = tl.load(cu_seqlens + b).to(tl.int64)
        end = tl.load(cu_seqlens + b + 1).to(tl.int64)
        return start, (end - start).to(tl.int32)
    else:
        return 0, n


@triton.jit
def _col_mask(offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Mask over the padded head dim; a splat constant when D is a power of two so loads stay vectorised."""
    if HEAD_DIM == BLOCK_D:
        ok = tl.full([BLOCK_D], 1, tl.int1)
    else:
        ok = offs_d < HEAD_DIM
    return ok


@triton.jit
def _fwd_block(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    skn,
    svn,
    offs_m,
    offs_n,
    offs_d,
    lo,
    hi,
    seqlen_k,
    diag,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    d_ok = _col_mask(offs_d, HEAD_DIM, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        kv_off = cols.to(tl.int64)
        if MASKED:
            n_ok = cols < seqlen_k
            kt = tl.load(
                k_base + kv_off[None, :] * skn + offs_d[:, None], mask=d_ok[:, None] & n_ok[None, :], other=0.0
            )
        else:
            kt = tl.load(k_base + kv_off[None, :] * skn + offs_d[:, None], mask=d_ok[:, None], other=0.0)
        s = tl.dot(q, kt, input_precision=DOT_PREC)
        if MASKED:
            ok = (cols < seqlen_k)[None, :]
            if CAUSAL:
                ok = ok & (cols[None, :] <= offs_m[:, None] + diag)
            s = tl.where(ok, s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # rows with nothing visible yet keep m = -inf; shift by 0 so exp2 gives 0, not NaN
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.math.exp2(s - m_safe[:, None])
            alpha = tl.math.exp2(m_i - m_safe)
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASKED:
            v = tl.load(v_base + kv_off[:, None] * svn + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        else:
            v = tl.load(v_base + kv_off[:, None] * svn + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _causal_ranges(start_m, seqlen_k, diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key ranges for a query block: [0, full) needs no mask, [full, hi) needs one."""
    full_k = (seqlen_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        # every row of the block sees keys <= start_m + diag
        full = ((start_m + diag + 1) // BLOCK_N) * BLOCK_N
        full = tl.minimum(tl.maximum(full, 0), full_k)
        hi = tl.minimum(start_m + BLOCK_M + diag, seqlen_k)
        hi = tl.maximum(hi, full)
    else:
        full = full_k
        hi = seqlen_k
    return full, hi


@triton.jit
def _attn_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    cu_q,
    cu_k,
    sqb,
    sqh,
    sqm,
    skb,
    skh,
    skn,
    svb,
    svh,
    svn,
    sob,
    soh,
    som,
    slb,
    slh,
    H,
    GROUP,
    Nq,
    Nk,
    NUM_M,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    VARLEN: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    # 1-D grid (no 65535 limit on B*H); m fastest so neighbours share K/V in L2
    pid = tl.program_id(0)
    pid_bh = pid // NUM_M
    pid_m = pid % NUM_M
    if CAUSAL:
        pid_m = NUM_M - 1 - pid_m  # longest rows first: better tail balance
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    q_start, seqlen_q = _seq_bounds(cu_q, b, Nq, VARLEN)
    k_start, seqlen_k = _seq_bounds(cu_k, b, Nk, VARLEN)
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen_q:
        return
    diag = seqlen_k - seqlen_q
    b64 = b.to(tl.int64)
    if VARLEN:
        b64 = b64 * 0
    q_base = Q + b64 * sqb + h.to(tl.int64) * sqh + q_start * sqm
    k_base = K + b64 * skb + hk.to(tl.int64) * skh + k_start * skn
    v_base = V + b64 * svb + hk.to(tl.int64) * svh + k_start * svn
    o_base = O + b64 * sob + h.to(tl.int64) * soh + q_start * som

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < seqlen_q
    d_ok = _col_mask(offs_d, HEAD_DIM, BLOCK_D)
    q = tl.load(
        q_base + offs_m.to(tl.int64)[:, None] * sqm + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0
    )

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full, hi = _causal_ranges(start_m, seqlen_k, diag, BLOCK_M, BLOCK_N, CAUSAL)
    # off-band tiles: no mask at all
    acc, l_i, m_i = _fwd_block(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        skn,
        svn,
        offs_m,
        offs_n,
        offs_d,
        0,
        full,
        seqlen_k,
        diag,
        qk_scale,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_D,
        False,
        CAUSAL,
        DOT_PREC,
    )
    # diagonal band and ragged tail: masked
    acc, l_i, m_i = _fwd_block(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        skn,
        svn,
        offs_m,
        offs_n,
        offs_d,
        full,
        hi,
        seqlen_k,
        diag,
        qk_scale,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_D,
        True,
        CAUSAL,
        DOT_PREC,
    )
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(
        o_base + offs_m.to(tl.int64)[:, None] * som + offs_d[None, :],
        out.to(O.dtype.element_ty),
        mask=m_ok[:, None] & d_ok[None, :],
    )
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    tl.store(LSE + b64 * slb + h.to(tl.int64) * slh + q_start + offs_m, lse, mask=m_ok)


# ---- split-KV decode -----------------------------------------------------------------------


@triton.jit
def _decode_split_kernel(
    Q,
    K,
    V,
    OPART,
    LPART,
    sqb,
    sqh,
    sqm,
    skb,
    skh,
    skn,
    svb,
    svh,
    svn,
    Hkv,
    GROUP,
    Nq,
    Nk,
    chunk,
    num_splits,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """One program: all GROUP*Nq query rows of one KV head against one KV chunk (GQA packing).
    With USE_TMA, K and V are rank-4 tensor descriptors over (B, Hkv, Nk, D): one bulk copy per tile
    instead of per-thread address math, which is what a bandwidth-bound loop spends its issue slots on."""
    pid_bk = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid_bk // Hkv).to(tl.int64)
    hk = (pid_bk % Hkv).to(tl.int64)
    R = GROUP * Nq
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    r_ok = offs_r < R
    d_ok = _col_mask(offs_d, HEAD_DIM, BLOCK_D)
    head = hk * GROUP + (offs_r // Nq)
    qi = offs_r % Nq
    q = tl.load(
        Q + b * sqb + head[:, None] * sqh + qi.to(tl.int64)[:, None] * sqm + offs_d[None, :],
        mask=r_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if not USE_TMA:
        k_base = K + b * skb + hk * skh
        v_base = V + b * svb + hk * svh
    diag = Nk - Nq
    lo = split * chunk
    hi = tl.minimum(lo + chunk, Nk)
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        n_ok = cols < hi
        kv_off = cols.to(tl.int64)
        if USE_TMA:
            # rows past Nk are zero-filled by the copy; rows of the next split are masked below
            kt = tl.trans(K.load([b.to(tl.int32), hk.to(tl.int32), start_n, 0]).reshape(BLOCK_N, BLOCK_D))
        else:
            kt = tl.load(
                k_base + kv_off[None, :] * skn + offs_d[:, None], mask=d_ok[:, None] & n_ok[None, :], other=0.0
            )
        s = tl.dot(q, kt, input_precision=DOT_PREC)
        ok = n_ok[None, :]
        if CAUSAL:
            ok = ok & (cols[None, :] <= qi[:, None] + diag)
        s = tl.where(ok, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if USE_TMA:
            v = V.load([b.to(tl.int32), hk.to(tl.int32), start_n, 0]).reshape(BLOCK_N, BLOCK_D)
        else:
            v = tl.load(v_base + kv_off[:, None] * svn + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    row = (pid_bk * num_splits + split).to(tl.int64) * R + offs_r
    tl.store(
        OPART + row[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None], mask=r_ok[:, None] & d_ok[None, :]
    )
    tl.store(LPART + row, m_i + tl.math.log2(l_i), mask=r_ok)  # log2 domain; -inf when empty


@triton.jit
def _decode_combine_kernel(
    OPART,
    LPART,
    O,
    LSE,
    sob,
    soh,
    som,
    slb,
    slh,
    Hkv,
    GROUP,
    Nq,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)  # over B * Hkv * R rows
    R = GROUP * Nq
    r = pid % R
    pid_bk = pid // R
    b = (pid_bk // Hkv).to(tl.int64)
    h = ((pid_bk % Hkv) * GROUP + r // Nq).to(tl.int64)
    qi = (r % Nq).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    d_ok = _col_mask(offs_d, HEAD_DIM, BLOCK_D)
    row = (pid_bk.to(tl.int64) * num_splits + offs_s) * R + r
    lse = tl.load(LPART + row, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse - m_safe)
    tot = tl.sum(w, 0)
    o = tl.load(OPART + row[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.where(tot == 0.0, 1.0, tot)
    tl.store(O + b * sob + h * soh + qi * som + offs_d, out.to(O.dtype.element_ty), mask=d_ok)
    tl.store(LSE + b * slb + h * slh + qi, (m + tl.math.log2(tot)) * 0.6931471805599453)


# ---- backward ------------------------------------------------------------------------------


@triton.jit
def _bwd_preprocess_kernel(
    O,
    DO,
    DLSE,
    DELTA,
    DQA,
    cu_q,
    sob,
    soh,
    som,
    sdob,
    sdoh,
    sdom,
    sqab,
    sqah,
    sqam,
    slb,
    slh,
    H,
    Nq,
    NUM_M,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    VARLEN: tl.constexpr,
    HAS_DLSE: tl.constexpr,
    ZERO_DQ: tl.constexpr,
):
    """delta = rowsum(dO * O) - dLSE (the LSE gradient folds into delta exactly); with ZERO_DQ also clears
    the fp32 dQ accumulator of the atomic-dQ backward (saves a memset launch)."""
    pid = tl.program_id(0)
    pid_bh = pid // NUM_M
    pid_m = pid % NUM_M
    b = pid_bh // H
    h = (pid_bh % H).to(tl.int64)
    q_start, seqlen_q = _seq_bounds(cu_q, b, Nq, VARLEN)
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen_q:
        return
    b64 = b.to(tl.int64)
    if VARLEN:
        b64 = b64 * 0
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < seqlen_q
    mask = m_ok[:, None] & _col_mask(offs_d, HEAD_DIM, BLOCK_D)[None, :]
    rows = (q_start + offs_m)[:, None]
    o = tl.load(O + b64 * sob + h * soh + rows * som + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + b64 * sdob + h * sdoh + rows * sdom + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    lrow = b64 * slb + h * slh + q_start + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLSE + lrow, mask=m_ok, other=0.0)
    tl.store(DELTA + lrow, delta, mask=m_ok)
    if ZERO_DQ:
        tl.store(DQA + b64 * sqab + h * sqah + rows * sqam + offs_d[None, :], tl.zeros_like(o), mask=mask)


@triton.jit
def _bwd_dq_convert_kernel(
    DQA,
    DQ,
    cu_q,
    sqab,
    sqah,
    sqam,
    sdqb,
    sdqh,
    sdqm,
    H,
    Nq,
    NUM_M,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    VARLEN: tl.constexpr,
):
    """dQ = sm_scale * (fp32 accumulator of the atomic-dQ backward), cast to the input dtype."""
    pid = tl.program_id(0)
    pid_bh = pid // NUM_M
    pid_m = pid % NUM_M
    b = pid_bh // H
    h = (pid_bh % H).to(tl.int64)
    q_start, seqlen_q = _seq_bounds(cu_q, b, Nq, VARLEN)
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen_q:
        return
    b64 = b.to(tl.int64)
    if VARLEN:
        b64 = b64 * 0
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m < seqlen_q)[:, None] & _col_mask(offs_d, HEAD_DIM, BLOCK_D)[None, :]
    rows = (q_start + offs_m)[:, None]
    acc = tl.load(DQA + b64 * sqab + h * sqah + rows * sqam + offs_d[None, :], mask=mask, other=0.0)
    dq = (acc * sm_scale).to(DQ.dtype.element_ty)
    tl.store(DQ + b64 * sdqb + h * sdqh + rows * sdqm + offs_d[None, :], dq, mask=mask)


@triton.jit
def _bwd_dkdv_block(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    l_base,
    d_base,
    dqa_base,
    sqm,
    sdom,
    sqam,
    offs_n,
    offs_d,
    lo,
    hi,
    seqlen_q,
    diag,
    qk2,
    b32,
    h32,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DQ_ATOMIC: tl.constexpr,
    OFF32: tl.constexpr,
    TMA: tl.constexpr,
):
    d_ok = _col_mask(offs_d, HEAD_DIM, BLOCK_D)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_ok = offs_m < seqlen_q
        # OFF32 (host-checked: rows * stride of one head fit in int32): 32-bit offsets from the per-head base
        # instead of 64-bit ones; the 64-bit address tiles of Q/dO made ptxas spill at the 64x128 tiles
        if OFF32:
            rows = offs_m
        else:
            rows = offs_m.to(tl.int64)
        if TMA:  # q_base/do_base are 4-D (B, H, N, D) descriptors: rows past N and columns past D read as 0
            qt = tl.trans(q_base.load([b32, h32, start_m, 0]).reshape(BLOCK_M, BLOCK_D))
        else:
            qt = tl.load(q_base + rows[None, :] * sqm + offs_d[:, None], mask=d_ok[:, None] & m_ok[None, :], other=0.0)
        # rows past the end get lse=+inf so p=0 there without an explicit mask
        lse2 = tl.load(l_base + offs_m, mask=m_ok, other=float("inf")) * 1.4426950408889634
        lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)  # rows that saw no key
        st = tl.dot(k, qt, input_precision=DOT_PREC) * qk2
        pt = tl.math.exp2(st - lse2[None, :])
        if MASKED:
            pt = tl.where(offs_m[None, :] + diag >= offs_n[:, None], pt, 0.0)
        if TMA:
            do = do_base.load([b32, h32, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
        else:
            do = tl.load(
                do_base + rows[:, None] * sdom + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0
            )
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=DOT_PREC)
        delta = tl.load(d_base + offs_m, mask=m_ok, other=0.0)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        dst = pt * (dpt - delta[None, :])
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=DOT_PREC)
        if DQ_ATOMIC:
            # this KV block's share of dQ (unscaled); rows past the end carry dS = 0 and are masked anyway
            dq = tl.dot(tl.trans(dst.to(k.dtype)), k, input_precision=DOT_PREC)
            if DQ_ATOMIC == 2:
                # one TMA reduce-add of the whole tile (the TMA unit adds it in L2; rows past N and
                # columns past D are clipped by the descriptor) instead of BLOCK_M*BLOCK_D scalar atomics
                dqa_base.atomic_add([b32, h32, start_m, 0], dq.reshape(1, 1, BLOCK_M, BLOCK_D))
            else:
                tl.atomic_add(
                    dqa_base + rows[:, None] * sqam + offs_d[None, :],
                    dq,
                    mask=m_ok[:, None] & d_ok[None, :],
                    sem="relaxed",
                )
    return dk, dv


@triton.jit
def _lpt_pid(pid, NUM_BLK, NUM_BH, LPT: tl.constexpr):
    """Program order for the causal backward (LPT > 0): block-major within groups of LPT (batch, head)
    pairs, returned in the programs' head-major numbering (bh * NUM_BLK + blk). The heaviest causal
    block of every head in a group runs before any head's lighter ones (longest-processing-time
    first, so the last wave holds the lightest blocks), while a group's K/V (or Q/dO) stay L2-sized.
    LPT = 0: the identity (head-major: one head's blocks heavy to light, then the next head's)."""
    if LPT > 0:
        grp = pid // (LPT * NUM_BLK)
        base = grp * LPT
        gs = tl.minimum(NUM_BH - base, LPT)  # the last group may hold fewer pairs
        r = pid - base * NUM_BLK
        pid = (base + r % gs) * NUM_BLK + r // gs
    return pid


@triton.jit
def _bwd_dkdv_program(
    pid,
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    DQA,
    cu_q,
    cu_k,
    sqb,
    sqh,
    sqm,
    skb,
    skh,
    skn,
    svb,
    svh,
    svn,
    sdob,
    sdoh,
    sdom,
    sdkb,
    sdkh,
    sdkn,
    sdvb,
    sdvh,
    sdvn,
    sqab,
    sqah,
    sqam,
    slb,
    slh,
    Hkv,
    GROUP,
    Nq,
    Nk,
    NUM_N,
    sm_scale,
    qk2,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    VARLEN: tl.constexpr,
    DOT_PREC: tl.constexpr,
    DQ_ATOMIC: tl.constexpr,
    OFF32: tl.constexpr = False,
    TMA: tl.constexpr = False,
    ONE_LOOP: tl.constexpr = False,
):
    """dK, dV for one KV block, summed over every query head of its GQA group (no scratch, no atomics).
    With DQ_ATOMIC it also adds its dQ share into an fp32 accumulator (5 GEMMs per tile instead of the
    4 + 3 of the separate dQ kernel), walking the query blocks from a per-program offset so neighbouring
    KV blocks do not hit the same dQ rows at the same time. ``pid``: this program's index among the dK/dV
    programs (the fused launch offsets it)."""
    pid_bk = pid // NUM_N
    pid_n = pid % NUM_N  # causal: low n sees the most queries and is scheduled first
    b = pid_bk // Hkv
    hk = pid_bk % Hkv
    q_start, seqlen_q = _seq_bounds(cu_q, b, Nq, VARLEN)
    k_start, seqlen_k = _seq_bounds(cu_k, b, Nk, VARLEN)
    start_n = pid_n * BLOCK_N
    if start_n >= seqlen_k:
        return
    diag = seqlen_k - seqlen_q
    b64 = b.to(tl.int64)
    if VARLEN:
        b64 = b64 * 0
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    n_ok = offs_n < seqlen_k
    d_ok = _col_mask(offs_d, HEAD_DIM, BLOCK_D)
    kv_mask = n_ok[:, None] & d_ok[None, :]
    rows_n = (k_start + offs_n)[:, None]
    k = tl.load(K + b64 * skb + hk.to(tl.int64) * skh + rows_n * skn + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b64 * svb + hk.to(tl.int64) * svh + rows_n * svn + offs_d[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    if CAUSAL:
        # the first query row that sees key start_n is start_n - diag; rows from mid on see the whole block
        lo = tl.maximum(((start_n - diag) // BLOCK_M) * BLOCK_M, 0)
        mid = tl.cdiv(start_n + BLOCK_N - 1 - diag, BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.maximum(mid, lo), tl.cdiv(seqlen_q, BLOCK_M) * BLOCK_M)
    else:
        lo = 0
        mid = 0
    hi = seqlen_q
    rot = mid
    # ONE_LOOP (causal): a single loop masking every block instead of a masked and an unmasked loop; two
    # pipelined loops keep more scalars live (offline sm90: TMA 64x128 w8 s3 spills 188 B with two, 60 B with one)
    tl.static_assert(not (ONE_LOOP and DQ_ATOMIC), "ONE_LOOP is for the split-dQ backward")
    if DQ_ATOMIC:
        n_blk = tl.cdiv(hi - mid, BLOCK_M)
        rot = mid + (pid_n % tl.maximum(n_blk, 1)) * BLOCK_M
        rot = tl.minimum(rot, hi)
    for g in range(0, GROUP):
        h32 = hk * GROUP + g
        h = h32.to(tl.int64)
        if TMA:  # host descriptors (never varlen): the block loads index them by (b, h, row)
            q_base = Q
            do_base = DO
        else:
            q_base = Q + b64 * sqb + h * sqh + q_start * sqm
            do_base = DO + b64 * sdob + h * sdoh + q_start * sdom
        l_base = LSE + b64 * slb + h * slh + q_start
        d_base = DELTA + b64 * slb + h * slh + q_start
        if DQ_ATOMIC == 2:  # DQA is a 4-D fp32 descriptor (never varlen), indexed by (b, h, row)
            dqa_base = DQA
        else:
            dqa_base = DQA + b64 * sqab + h * sqah + q_start * sqam
        if CAUSAL and not ONE_LOOP:
            dk, dv = _bwd_dkdv_block(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                l_base,
                d_base,
                dqa_base,
                sqm,
                sdom,
                sqam,
                offs_n,
                offs_d,
                lo,
                mid,
                seqlen_q,
                diag,
                qk2,
                b,
                h32,
                HEAD_DIM,
                BLOCK_M,
                BLOCK_D,
                True,
                DOT_PREC,
                DQ_ATOMIC,
                OFF32,
                TMA,
            )
        dk, dv = _bwd_dkdv_block(
            dk,
            dv,
            k,
            v,
            q_base,
            do_base,
            l_base,
            d_base,
            dqa_base,
            sqm,
            sdom,
            sqam,
            offs_n,
            offs_d,
            lo if ONE_LOOP else rot,
            hi,
            seqlen_q,
            diag,
            qk2,
            b,
            h32,
            HEAD_DIM,
            BLOCK_M,
            BLOCK_D,
            ONE_LOOP and CAUSAL,
            DOT_PREC,
            DQ_ATOMIC,
            OFF32,
            TMA,
        )
        if DQ_ATOMIC:
            dk, dv = _bwd_dkdv_block(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                l_base,
                d_base,
                dqa_base,
                sqm,
                sdom,
                sqam,
                offs_n,
                offs_d,
                mid,
                rot,
                seqlen_q,
                diag,
                qk2,
                b,
                h32,
                HEAD_DIM,
                BLOCK_M,
                BLOCK_D,
                False,
                DOT_PREC,
                DQ_ATOMIC,
                OFF32,
                TMA,
            )
    dk = dk * sm_scale
    tl.store(
        DK + b64 * sdkb + hk.to(tl.int64) * sdkh + rows_n * sdkn + offs_d[None, :],
        dk.to(DK.dtype.element_ty),
        mask=kv_mask,
    )
    tl.store(
        DV + b64 * sdvb + hk.to(tl.int64) * sdvh + rows_n * sdvn + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=kv_mask,
    )


@triton.jit
def _bwd_dq_block(
    dq,
    q,
    do,
    lse2,
    delta,
    k_base,
    v_base,
    skn,
    svn,
    offs_m,
    offs_n,
    offs_d,
    lo,
    hi,
    seqlen_k,
    diag,
    qk2,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    d_ok = _col_mask(offs_d, HEAD_DIM, BLOCK_D)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        kv_off = cols.to(tl.int64)
        if MASKED:
            n_ok = cols < seqlen_k
            ld_mask = d_ok[:, None] & n_ok[None, :]
        else:
            ld_mask = d_ok[:, None]
        kt = tl.load(k_base + kv_off[None, :] * skn + offs_d[:, None], mask=ld_mask, other=0.0)
        vt = tl.load(v_base + kv_off[None, :] * svn + offs_d[:, None], mask=ld_mask, other=0.0)
        s = tl.dot(q, kt, input_precision=DOT_PREC) * qk2
        p = tl.math.exp2(s - lse2[:, None])
        if MASKED:
            ok = (cols < seqlen_k)[None, :]
            if CAUSAL:
                ok = ok & (cols[None, :] <= offs_m[:, None] + diag)
            p = tl.where(ok, p, 0.0)
        dp = tl.dot(do, vt, input_precision=DOT_PREC)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=DOT_PREC)
    return dq


@triton.jit
def _bwd_dq_program(
    pid,
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    cu_q,
    cu_k,
    sqb,
    sqh,
    sqm,
    skb,
    skh,
    skn,
    svb,
    svh,
    svn,
    sdob,
    sdoh,
    sdom,
    sdqb,
    sdqh,
    sdqm,
    slb,
    slh,
    H,
    GROUP,
    Nq,
    Nk,
    NUM_M,
    sm_scale,
    qk2,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    VARLEN: tl.constexpr,
    DOT_PREC: tl.constexpr,
):
    pid_bh = pid // NUM_M
    pid_m = pid % NUM_M
    if CAUSAL:
        pid_m = NUM_M - 1 - pid_m
    b = pid_bh // H
    h = pid_bh % H
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    q_start, seqlen_q = _seq_bounds(cu_q, b, Nq, VARLEN)
    k_start, seqlen_k = _seq_bounds(cu_k, b, Nk, VARLEN)
    start_m = pid_m * BLOCK_M
    if start_m >= seqlen_q:
        return
    diag = seqlen_k - seqlen_q
    b64 = b.to(tl.int64)
    if VARLEN:
        b64 = b64 * 0
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < seqlen_q
    mask = m_ok[:, None] & _col_mask(offs_d, HEAD_DIM, BLOCK_D)[None, :]
    rows = (q_start + offs_m)[:, None]
    q = tl.load(Q + b64 * sqb + h * sqh + rows * sqm + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b64 * sdob + h * sdoh + rows * sdom + offs_d[None, :], mask=mask, other=0.0)
    lrow = b64 * slb + h * slh + q_start + offs_m
    lse2 = tl.load(LSE + lrow, mask=m_ok, other=float("inf")) * 1.4426950408889634
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
    delta = tl.load(DELTA + lrow, mask=m_ok, other=0.0)
    k_base = K + b64 * skb + hk * skh + k_start * skn
    v_base = V + b64 * svb + hk * svh + k_start * svn
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full, hi = _causal_ranges(start_m, seqlen_k, diag, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _bwd_dq_block(
        dq,
        q,
        do,
        lse2,
        delta,
        k_base,
        v_base,
        skn,
        svn,
        offs_m,
        offs_n,
        offs_d,
        0,
        full,
        seqlen_k,
        diag,
        qk2,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_D,
        False,
        CAUSAL,
        DOT_PREC,
    )
    dq = _bwd_dq_block(
        dq,
        q,
        do,
        lse2,
        delta,
        k_base,
        v_base,
        skn,
        svn,
        offs_m,
        offs_n,
        offs_d,
        full,
        hi,
        seqlen_k,
        diag,
        qk2,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_D,
        True,
        CAUSAL,
        DOT_PREC,
    )
    dq = dq * sm_scale
    tl.store(DQ + b64 * sdqb + h * sdqh + rows * sdqm + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_kernel(
    Q,
    K,
    V,
    DO,
    QD,
    DOD,
    LSE,
    DELTA,
    DK,
    DV,
    DQ,
    DQA,
    cu_q,
    cu_k,
    sqb,
    sqh,
    sqm,
    skb,
    skh,
    skn,
    svb,
    svh,
    svn,
    sdob,
    sdoh,
    sdom,
    sdkb,
    sdkh,
    sdkn,
    sdvb,
    sdvh,
    sdvn,
    sdqb,
    sdqh,
    sdqm,
    slb,
    slh,
    H,
    Hkv,
    GROUP,
    Nq,
    Nk,
    NUM_N,
    NUM_M,
    N_FIRST,
    sm_scale,
    qk2,
    HEAD_DIM: tl.constexpr,
    BLOCK_M1: tl.constexpr,
    BLOCK_N1: tl.constexpr,
    BLOCK_M2: tl.constexpr,
    BLOCK_N2: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    VARLEN: tl.constexpr,
    DOT_PREC: tl.constexpr,
    OFF32: tl.constexpr = False,
    TMA: tl.constexpr = False,
    ONE_LOOP: tl.constexpr = False,
    DQ_FIRST: tl.constexpr = False,
    LPT: tl.constexpr = 0,
    PART: tl.constexpr = 0,
    DQ_ATOMIC: tl.constexpr = False,
):
    """The backward's dK/dV programs (BLOCK_M1 x BLOCK_N1 tiles) and dQ programs (BLOCK_M2 x BLOCK_N2).
    PART 1: a grid of dK/dV programs only, PART 2: dQ programs only -- the split backward is two
    launches of this kernel, and the other part is compiled out. PART 0 (FUSED): both in one launch;
    they only read the preprocess's delta, so they can share one grid -- no kernel boundary, and the
    tail of one fills with programs of the other. The first N_FIRST program ids are dK/dV programs
    (DQ_FIRST: dQ programs), the rest the other kind. QD/DOD: the dK/dV loop's Q/dO (TMA descriptors
    when TMA, else the Q/DO pointers). DQ: the dQ programs' output. DQA: with DQ_ATOMIC (PART 1) the fp32
    accumulator the dK/dV programs add their dQ shares into (DQ_ATOMIC 2: its TMA descriptor), else unused.
    DQ_ATOMIC 2 needs the separate argument: the dQ program is traced even where PART compiles it out."""
    pid = tl.program_id(0)
    if PART == 1:
        is_dq = False
        sub, n_dq, n_dkdv = pid, 0, tl.num_programs(0)
    elif PART == 2:
        is_dq = True
        sub, n_dq, n_dkdv = pid, tl.num_programs(0), 0
    else:
        n_rest = tl.num_programs(0) - N_FIRST
        if DQ_FIRST:
            is_dq = pid < N_FIRST
            sub = tl.where(is_dq, pid, pid - N_FIRST)
            n_dq, n_dkdv = N_FIRST, n_rest
        else:
            is_dq = pid >= N_FIRST
            sub = tl.where(is_dq, pid - N_FIRST, pid)
            n_dq, n_dkdv = n_rest, N_FIRST
    if is_dq:
        _bwd_dq_program(
            _lpt_pid(sub, NUM_M, n_dq // NUM_M, LPT),
            Q,
            K,
            V,
            DO,
            LSE,
            DELTA,
            DQ,
            cu_q,
            cu_k,
            sqb,
            sqh,
            sqm,
            skb,
            skh,
            skn,
            svb,
            svh,
            svn,
            sdob,
            sdoh,
            sdom,
            sdqb,
            sdqh,
            sdqm,
            slb,
            slh,
            H,
            GROUP,
            Nq,
            Nk,
            NUM_M,
            sm_scale,
            qk2,
            HEAD_DIM,
            BLOCK_M2,
            BLOCK_N2,
            BLOCK_D,
            CAUSAL,
            VARLEN,
            DOT_PREC,
        )
    else:
        _bwd_dkdv_program(
            _lpt_pid(sub, NUM_N, n_dkdv // NUM_N, LPT),
            QD,
            K,
            V,
            DOD,
            LSE,
            DELTA,
            DK,
            DV,
            DQA,
            cu_q,
            cu_k,
            sqb,
            sqh,
            sqm,
            skb,
            skh,
            skn,
            svb,
            svh,
            svn,
            sdob,
            sdoh,
            sdom,
            sdkb,
            sdkh,
            sdkn,
            sdvb,
            sdvh,
            sdvn,
            sdqb,
            sdqh,
            sdqm,
            slb,
            slh,
            Hkv,
            GROUP,
            Nq,
            Nk,
            NUM_N,
            sm_scale,
            qk2,
            HEAD_DIM,
            BLOCK_M1,
            BLOCK_N1,
            BLOCK_D,
            CAUSAL,
            VARLEN,
            DOT_PREC,
            DQ_ATOMIC,
            OFF32,
            TMA,
            ONE_LOOP,
        )


# --------------------------------------------------------------------------------------------
# Configs: shipped per-arch table, opt-in autotune (FLASHATTN_TRITON_AUTOTUNE=1)
# --------------------------------------------------------------------------------------------

_DTYPE_KEY = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_AUTOTUNE_CACHE: dict[tuple, dict] = {}


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def _dot_prec(dtype: torch.dtype) -> str:
    # fp32 inputs are computed in true fp32 (no silent TF32 rounding); fp16/bf16 ignore this
    return "ieee" if dtype == torch.float32 else "tf32"


def seqlen_bucket(n: int) -> int:
    """Power-of-two bucket used as the tuning key (1k, 2k, 4k ...)."""
    return triton.next_power_of_2(max(int(n), 1))


def _table_config(kernel: str, arch: str, head_dim: int, causal: bool, seqlen: int, dtype: torch.dtype) -> dict:
    return _TUNING.lookup(
        arch,
        kernel=kernel,
        head_dim=_block_d(head_dim),
        causal=bool(causal),
        seqlen=seqlen_bucket(seqlen),
        dtype=_DTYPE_KEY[dtype],
    )


def autotune_enabled() -> bool:
    return os.environ.get("FLASHATTN_TRITON_AUTOTUNE", "0").strip() not in ("", "0")


def candidate_configs(kernel: str, head_dim: int, dtype: torch.dtype) -> list[dict]:
    """The pruned search space (also swept by scripts/tune_flash.py): a few shapes known to suit
    wgmma/mma tiles, filtered so big head dims and fp32 stay inside shared memory and registers."""
    bd = _block_d(head_dim)
    big = bd >= 256 or dtype == torch.float32
    if kernel == "fwd":
        space = [
            (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3),
            (128, 32, 4, 3), (128, 64, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3), (64, 32, 4, 2),
        ]  # fmt: skip
        return [
            dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st)
            for m, n, w, st in space
            if not (big and (m > 64 or n > 64 or st > 2)) and not (bd >= 128 and n >= 128 and st > 2)
        ]
    if kernel == "bwd":
        space = [
            (64, 128, 8, 2), (64, 128, 8, 3), (64, 128, 4, 2), (32, 128, 4, 3), (64, 64, 4, 3),
            (32, 64, 4, 4), (32, 64, 4, 2), (16, 32, 4, 1),
        ]  # fmt: skip
        split = [
            dict(BLOCK_M1=m, BLOCK_N1=n, BLOCK_M2=n, BLOCK_N2=m, num_warps=w, num_stages=st)
            for m, n, w, st in space
            if not (big and (n > 64 or st > 2))
        ]
        # atomic dQ (dK/dV kernel accumulates dQ in fp32): fewer GEMMs, more registers -> 8 warps only;
        # 2 = one TMA reduce-add per tile on Hopper (the scalar atomics elsewhere)
        atomic = [
            dict(BLOCK_M1=m, BLOCK_N1=n, BLOCK_M2=n, BLOCK_N2=m, num_warps=8, num_stages=st, DQ_ATOMIC=2)
            for m, n, st in ((32, 128, 3), (64, 64, 3), (64, 128, 2))
            if not big
        ]
        return split + atomic
    if kernel == "decode":
        return [
            dict(BLOCK_N=n, num_warps=w, num_stages=st)
            for n in (32, 64, 128)
            for w in (4, 8)
            for st in (2, 3, 4)
            if not (big and (n > 64 or st > 2))
        ] + [
            dict(BLOCK_N=n, num_warps=4, num_stages=st, TMA=True, WAVES=wv)
            for n, st, wv in ((64, 4, 2), (128, 2, 2), (128, 3, 1), (32, 4, 4))
            if not big
        ]
    raise ValueError(f"unknown kernel {kernel!r}")


def _bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=20)


def get_config(
    kernel: str, device: torch.device, head_dim: int, causal: bool, seqlen: int, dtype: torch.dtype, launch=None
) -> dict:
    """Shipped config for this shape; with FLASHATTN_TRITON_AUTOTUNE=1 on a GPU, the best of the pruned space
    (measured once per (kernel, arch, head dim, causal, seqlen bucket, dtype) through ``launch(config)``)."""
    arch = arch_key(device)
    cfg = _table_config(kernel, arch, head_dim, causal, seqlen, dtype)
    if launch is None or device.type != "cuda" or not autotune_enabled():
        return cfg
    key = (kernel, arch, _block_d(head_dim), bool(causal), seqlen_bucket(seqlen), dtype)
    if key not in _AUTOTUNE_CACHE:
        best, best_ms = cfg, float("inf")
        for cand in [cfg] + candidate_configs(kernel, head_dim, dtype):
            try:
                ms = _bench(lambda c=cand: launch(c))
            except Exception:  # out of shared memory / registers for this shape
                continue
            if ms < best_ms:
                best, best_ms = cand, ms
        _AUTOTUNE_CACHE[key] = best
    return dict(_AUTOTUNE_CACHE[key])


# --------------------------------------------------------------------------------------------
# Input checks
# --------------------------------------------------------------------------------------------


def _check_head_dim(d: int) -> None:
    if d < 8 or d > MAX_HEAD_DIM or d % 8:
        raise ValueError(f"q/k/v head dim must be a multiple of 8 in [8, {MAX_HEAD_DIM}], got {d}")


def _check_scale(sm_scale, d: int) -> float:
    if sm_scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale must be a float or None, got {type(sm_scale).__name__}")
    if not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be finite, got {sm_scale}")
    return float(sm_scale)


def check_inputs(q, k, v, sm_scale=None) -> tuple[torch.device, float]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, dtypes=SUPPORTED_DTYPES, rank=4)
    device = check_same_device(q=q, k=k, v=v)
    select_backend(device)  # raises for unsupported device types
    if k.dtype != q.dtype:
        raise TypeError(f"k must have the same dtype as q ({q.dtype}), got {k.dtype}")
    if v.dtype != q.dtype:
        raise TypeError(f"v must have the same dtype as q ({q.dtype}), got {v.dtype}")
    B, H, Nq, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if k.shape[0] != B:
        raise ValueError(f"k batch size {k.shape[0]} does not match q batch size {B}")
    Hkv = k.shape[1]
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"q heads ({H}) must be a multiple of k/v heads ({Hkv})")
    if k.shape[3] != D:
        raise ValueError(f"k head dim {k.shape[3]} does not match q head dim {D}")
    _check_head_dim(D)
    if Nq < 1 or k.shape[2] < 1:
        raise ValueError(f"sequence lengths must be >= 1, got q {Nq} and k {k.shape[2]}")
    return device, _check_scale(sm_scale, D)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    # kernels need a unit stride on the head dim (vectorised loads); every other stride is free
    return t if t.stride(-1) == 1 else t.contiguous()


# --------------------------------------------------------------------------------------------
# PyTorch reference path (CPU without the interpreter): float32 math, same semantics
# --------------------------------------------------------------------------------------------


def causal_mask(nq: int, nk: int, device=None) -> torch.Tensor:
    """Bottom-right aligned causal mask (True = visible): query i sees key j iff j <= i + nk - nq."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i + (nk - nq)


def _ref_scores(q, k, causal, sm_scale):
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    s = torch.matmul(q.float(), kf.transpose(-1, -2)) * sm_scale
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    return s


def _torch_forward(q, k, v, causal, sm_scale):
    group = q.shape[1] // k.shape[1]
    s = _ref_scores(q, k, causal, sm_scale)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    out = torch.matmul(p, v.float().repeat_interleave(group, dim=1))
    return out.to(q.dtype), lse


def _torch_backward(do, q, k, v, out, lse, dlse, causal, sm_scale):
    B, Hkv, Nk, D = k.shape
    group = q.shape[1] // Hkv
    s = _ref_scores(q, k, causal, sm_scale)
    lse_safe = torch.where(torch.isinf(lse), float("inf"), lse)
    p = torch.exp(s - lse_safe[..., None])
    dof = do.float()
    delta = (dof * out.float()).sum(-1)
    if dlse is not None:
        delta = delta - dlse.float()
    vf = v.float().repeat_interleave(group, dim=1)
    kf = k.float().repeat_interleave(group, dim=1)
    dp = torch.matmul(dof, vf.transpose(-1, -2))
    ds = p * (dp - delta[..., None])
    dq = torch.matmul(ds, kf) * sm_scale
    dk = (torch.matmul(ds.transpose(-1, -2), q.float()) * sm_scale).view(B, Hkv, group, Nk, D).sum(2)
    dv = torch.matmul(p.transpose(-1, -2), dof).view(B, Hkv, group, Nk, D).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# --------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------


def use_decode_path(q: torch.Tensor, k: torch.Tensor) -> bool:
    _, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    # split-KV with GQA packing reads each K/V tile once per group (the regular grid reads it once per
    # query head) and fills the GPU even for B=1; at large batch it simply picks one split
    rows = max(16, triton.next_power_of_2((H // Hkv) * Nq))
    return Nq <= DECODE_MAX_NQ and Nk >= DECODE_MIN_NK and rows * _block_d(D) <= 128 * 128


def _fwd_launch(q, k, v, out, lse, causal, sm_scale, cfg, cu_q=None, cu_k=None, max_q=None, max_k=None):
    varlen = cu_q is not None
    if varlen:
        B = cu_q.numel() - 1
        _, H, D = q.shape
        Hkv = k.shape[1]
        Nq, Nk = max_q, max_k
        sq = (0, q.stride(1), q.stride(0))
        sk = (0, k.stride(1), k.stride(0))
        sv = (0, v.stride(1), v.stride(0))
        so = (0, out.stride(1), out.stride(0))
        sl = (0, lse.stride(0))
    else:
        B, H, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        sq, sk, sv = q.stride()[:3], k.stride()[:3], v.stride()[:3]
        so = out.stride()[:3]
        sl = lse.stride()[:2]
    if cfg.get("SM90") and not varlen and _fwd_sm90.eligible(q, k, v):
        # Hopper: the warp-specialized Gluon kernel (TMA producer + two pipelined consumer warpgroups)
        return _fwd_sm90.launch(q, k, v, out, lse, causal, sm_scale, cfg)
    bm = cfg["BLOCK_M"]
    num_m = triton.cdiv(Nq, bm)
    _attn_fwd_kernel[(num_m * B * H,)](
        q,
        k,
        v,
        out,
        lse,
        cu_q,
        cu_k,
        *sq,
        *sk,
        *sv,
        *so,
        *sl,
        H,
        H // Hkv,
        Nq,
        Nk,
        num_m,
        sm_scale * LOG2E,
        HEAD_DIM=D,
        BLOCK_M=bm,
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_D=_block_d(D),
        CAUSAL=bool(causal),
        VARLEN=varlen,
        DOT_PREC=_dot_prec(q.dtype),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """Can rank-4 host TMA descriptors (``_tile_desc``) cover these tensors? fp16/bf16 (fp32 stays on
    the exact-fp32 pointer loads), Hopper+, unit last stride, 16-byte aligned base and 16-byte multiple
    outer strides (a (B, N, H, D) view qualifies whenever D % 8 == 0), and a Triton with descriptors.
    CPU tensors qualify: the interpreter emulates descriptors."""
    if _TensorDescriptor is None:
        return False
    for t in tensors:
        if t.dtype not in (torch.float16, torch.bfloat16) or t.dim() != 4 or t.stride(3) != 1 or t.data_ptr() % 16:
            return False
        if t.device.type == "cuda" and capability(t.device)[0] < 9:
            return False  # no TMA before Hopper
        if any((st * t.element_size()) % 16 for st in t.stride()[:3]):
            return False
    return True


def _tile_desc(t: torch.Tensor, rows: int, block_d: int):
    """Host descriptor over a strided (B, H, N, D) view; tiles are addressed [b, h, row, 0]."""
    return _TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, block_d])


def decode_num_splits(device: torch.device, batch_kv_heads: int, nk: int, block_n: int, waves: float = 2) -> int:
    """The most KV splits for which B*Hkv*splits programs fit in ``waves`` waves of SMs (at least one split,
    and at least one KV tile per split). Rounding down, not up: a split CTA takes a whole SM's shared memory,
    so a partial extra wave costs as much as a full one (B8 Hkv8 at 2 waves: 4 splits, not 5; H200, 4-5%
    faster at L 8k/32k)."""
    n_blocks = triton.cdiv(nk, block_n)
    want = int(waves * num_sms(device)) // batch_kv_heads
    return max(1, min(want, n_blocks, 256))


def _decode_tma_ok(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and _tma_ok(t)


def _decode_launch(q, k, v, out, lse, causal, sm_scale, cfg, num_splits=None):
    B, H, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = H // Hkv
    bn = cfg["BLOCK_N"]
    if num_splits is None:
        num_splits = decode_num_splits(q.device, B * Hkv, Nk, bn, cfg.get("WAVES", 2))
    chunk = triton.cdiv(triton.cdiv(Nk, num_splits), bn) * bn
    num_splits = triton.cdiv(Nk, chunk)
    R = group * Nq
    opart = torch.empty((B * Hkv, num_splits, R, D), device=q.device, dtype=torch.float32)
    lpart = torch.empty((B * Hkv, num_splits, R), device=q.device, dtype=torch.float32)
    bd = _block_d(D)
    use_tma = bool(cfg.get("TMA", False)) and _decode_tma_ok(k) and _decode_tma_ok(v)
    kk, vv = (_tile_desc(k, bn, bd), _tile_desc(v, bn, bd)) if use_tma else (k, v)
    _decode_split_kernel[(B * Hkv, num_splits)](
        q,
        kk,
        vv,
        opart,
        lpart,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        Hkv,
        group,
        Nq,
        Nk,
        chunk,
        num_splits,
        sm_scale * LOG2E,
        HEAD_DIM=D,
        BLOCK_R=max(16, triton.next_power_of_2(R)),
        BLOCK_N=bn,
        BLOCK_D=bd,
        CAUSAL=bool(causal),
        DOT_PREC=_dot_prec(q.dtype),
        USE_TMA=use_tma,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    _decode_combine_kernel[(B * Hkv * R,)](
        opart,
        lpart,
        out,
        lse,
        *out.stride()[:3],
        *lse.stride()[:2],
        Hkv,
        group,
        Nq,
        num_splits,
        HEAD_DIM=D,
        BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
        BLOCK_D=bd,
        num_warps=4 if bd >= 128 else 2,
    )


def _forward_impl(q, k, v, causal, sm_scale, force_decode=None):
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    backend = select_backend(q.device)
    # the output keeps q's storage order (e.g. a (B, N, H, D) buffer viewed as (B, H, N, D)) on every
    # backend, as the fake implementation promises
    out = torch.empty_like(q) if q.stride(-1) == 1 else torch.empty(q.shape, device=q.device, dtype=q.dtype)
    if backend == Backend.TORCH:
        o, lse = _torch_forward(q, k, v, causal, sm_scale)
        return out.copy_(o), lse.contiguous()
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    lse = torch.empty((B, H, Nq), device=q.device, dtype=torch.float32)
    decode = use_decode_path(q, k) if force_decode is None else force_decode
    if decode:
        launch = lambda c: _decode_launch(q, k, v, out, lse, causal, sm_scale, c)
        launch(get_config("decode", q.device, D, causal, Nk, q.dtype, launch))
    else:
        launch = lambda c: _fwd_launch(q, k, v, out, lse, causal, sm_scale, c)
        launch(get_config("fwd", q.device, D, causal, max(Nq, Nk), q.dtype, launch))
    return out, lse


_OFF32_LIMIT = 2**31  # tests lower it to force the 64-bit offset path


def _backward_launch(
    do, q, k, v, out, lse, dlse, dq, dk, dv, causal, sm_scale, cfg, cu_q=None, cu_k=None, max_q=None, max_k=None
):
    varlen = cu_q is not None
    if varlen:
        B = cu_q.numel() - 1
        _, H, D = q.shape
        Hkv = k.shape[1]
        Nq, Nk = max_q, max_k

        def st(t):
            return (0, t.stride(1), t.stride(0))

        sl = (0, lse.stride(0))
    else:
        B, H, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]

        def st(t):
            return t.stride()[:3]

        sl = lse.stride()[:2]
    group = H // Hkv
    bd = _block_d(D)
    delta = torch.empty_like(lse)
    # atomic dQ: the dK/dV kernel also accumulates dQ in fp32 (cleared by the preprocess, cast at the end);
    # DQ_ATOMIC 1: scalar atomics, 2: one TMA reduce-add per tile (Hopper, not varlen; else 1)
    dq_atomic = int(cfg.get("DQ_ATOMIC", 0))
    if dq_atomic == 2 and (varlen or _TensorDescriptor is None or q.device.type != "cuda"):
        dq_atomic = 1  # the interpreter has no descriptor reduce either
    if dq_atomic == 2 and capability(q.device)[0] < 9:
        dq_atomic = 1  # no TMA before Hopper
    dqa = torch.empty(q.shape, device=q.device, dtype=torch.float32) if dq_atomic else dq
    pre_bm = 64
    num_pre = triton.cdiv(Nq, pre_bm)
    _bwd_preprocess_kernel[(num_pre * B * H,)](
        out,
        do,
        dlse if dlse is not None else lse,
        delta,
        dqa,
        cu_q,
        *st(out),
        *st(do),
        *st(dqa),
        *sl,
        H,
        Nq,
        num_pre,
        HEAD_DIM=D,
        BLOCK_M=pre_bm,
        BLOCK_D=bd,
        VARLEN=varlen,
        HAS_DLSE=dlse is not None,
        ZERO_DQ=bool(dq_atomic),
    )
    prec = _dot_prec(q.dtype)
    bm1 = cfg["BLOCK_M1"]
    num_n = triton.cdiv(Nk, cfg["BLOCK_N1"])
    num_m = triton.cdiv(Nq, cfg["BLOCK_M2"])
    # TMA=1: Q and dO tiles of the dK/dV loop come by TMA (4-D host descriptors, no per-thread addresses)
    tma = bool(cfg.get("TMA", 0)) and not varlen and _tma_ok(q, do)
    if tma:
        qa, doa = (_tile_desc(t, bm1, bd) for t in (q, do))
    else:
        qa, doa = q, do
    # 32-bit row offsets from the per-head base when a head's rows (plus one tile of slack) fit in int32
    row_stride = max(st(q)[2], st(do)[2], st(dqa)[2], 1)
    off32 = (Nq + bm1) * row_stride + bd < _OFF32_LIMIT
    one_loop = bool(cfg.get("ONE_LOOP", 0)) and not dq_atomic
    # optional per-launch knobs: maxnreg caps registers per thread (ptxas .maxnreg); the dQ kernel may take its
    # own num_warps2/num_stages2/maxnreg2 (defaults: the dK/dV kernel's warps/stages, no cap)
    opts1 = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if cfg.get("maxnreg"):
        opts1["maxnreg"] = int(cfg["maxnreg"])
    fused = int(cfg.get("FUSED", 0)) if not dq_atomic else 0
    # SM90_DKDV (Hopper, dense, split dQ): dK/dV from the warp-specialized Gluon kernel, dQ from PART 2 below
    sm90_dkdv = bool(cfg.get("SM90_DKDV", 0)) and not varlen and not dq_atomic and _bwd_sm90.eligible(q, k, v, do)
    if sm90_dkdv:
        fused = 0
    # LPT (causal): programs ordered block-major within groups of LPT (batch, head) pairs, see _lpt_pid
    lpt = int(cfg.get("LPT", 0)) if causal else 0
    n_dkdv, n_dq = num_n * B * Hkv, num_m * B * H

    def run(part, grid, dqt, n_first=0, opts=opts1):
        # one launch of _bwd_kernel: PART 1 dK/dV programs, 2 dQ programs, 0 both (FUSED)
        dqa_arg = dqt
        if dq_atomic == 2:  # the accumulator as a descriptor over its (B, H, Nq, D) tiles
            dqa_arg = _tile_desc(dqt, bm1, bd)
        _bwd_kernel[(grid,)](
            q,
            k,
            v,
            do,
            qa,
            doa,
            lse,
            delta,
            dk,
            dv,
            dqt,
            dqa_arg,
            cu_q,
            cu_k,
            *st(q),
            *st(k),
            *st(v),
            *st(do),
            *st(dk),
            *st(dv),
            *st(dqt),
            *sl,
            H,
            Hkv,
            group,
            Nq,
            Nk,
            num_n,
            num_m,
            n_first,
            sm_scale,
            sm_scale * LOG2E,
            HEAD_DIM=D,
            BLOCK_M1=cfg["BLOCK_M1"],
            BLOCK_N1=cfg["BLOCK_N1"],
            BLOCK_M2=cfg["BLOCK_M2"],
            BLOCK_N2=cfg["BLOCK_N2"],
            BLOCK_D=bd,
            CAUSAL=bool(causal),
            VARLEN=varlen,
            DOT_PREC=prec,
            OFF32=off32,
            TMA=tma,
            ONE_LOOP=one_loop,
            DQ_FIRST=fused == 2,
            LPT=lpt,
            PART=part,
            DQ_ATOMIC=dq_atomic,
            **opts,
        )

    if fused:  # FUSED=1 (dK/dV programs first) or 2 (dQ programs first): one launch for both
        run(0, n_dkdv + n_dq, dq, n_first=n_dq if fused == 2 else n_dkdv)
        return
    if sm90_dkdv:
        _bwd_sm90.launch_dkdv(q, k, v, do, lse, delta, dk, dv, causal, sm_scale, cfg)
    else:
        run(1, n_dkdv, dqa)
    if dq_atomic:
        _bwd_dq_convert_kernel[(num_pre * B * H,)](
            dqa,
            dq,
            cu_q,
            *st(dqa),
            *st(dq),
            H,
            Nq,
            num_pre,
            sm_scale,
            HEAD_DIM=D,
            BLOCK_M=pre_bm,
            BLOCK_D=bd,
            VARLEN=varlen,
        )
        return
    opts2 = dict(
        num_warps=cfg.get("num_warps2") or cfg["num_warps"], num_stages=cfg.get("num_stages2") or cfg["num_stages"]
    )
    if cfg.get("maxnreg2"):
        opts2["maxnreg"] = int(cfg["maxnreg2"])
    run(2, n_dq, dq, opts=opts2)


def _backward_impl(do, q, k, v, out, lse, dlse, causal, sm_scale):
    do, q, k, v, out = (_unit_last(t) for t in (do, q, k, v, out))
    if select_backend(q.device) == Backend.TORCH:
        return _torch_backward(do, q, k, v, out, lse, dlse, causal, sm_scale)
    lse = lse.contiguous()
    dlse = dlse.contiguous() if dlse is not None else None
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    D = q.shape[-1]
    launch = lambda c: _backward_launch(do, q, k, v, out, lse, dlse, dq, dk, dv, causal, sm_scale, c)
    launch(get_config("bwd", q.device, D, causal, max(q.shape[2], k.shape[2]), q.dtype, launch))
    return dq, dk, dv


# --------------------------------------------------------------------------------------------
# torch.library custom ops + autograd
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("flashattn_triton::flash_attn_fwd", mutates_args=())
def flash_attn_fwd_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_impl(q, k, v, causal, sm_scale)


@flash_attn_fwd_op.register_fake
def _(q, k, v, causal, sm_scale):
    B, H, Nq, _ = q.shape
    out = torch.empty_like(q) if q.stride(-1) == 1 else q.new_empty(q.shape)
    return out, q.new_empty((B, H, Nq), dtype=torch.float32)


@torch.library.custom_op("flashattn_triton::flash_attn_bwd", mutates_args=())
def flash_attn_bwd_op(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dlse: torch.Tensor | None,
    causal: bool,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_impl(do, q, k, v, out, lse, dlse, causal, sm_scale)


@flash_attn_bwd_op.register_fake
def _(do, q, k, v, out, lse, dlse, causal, sm_scale):
    def like(t):
        return torch.empty_like(t) if t.stride(-1) == 1 else t.new_empty(t.shape)

    return like(q), like(k), like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, sm_scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.sm_scale = causal, sm_scale
    # An unused LSE output gets None instead of a zero-filled tensor (and a fill kernel) per step.
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    # Eager: the implementation directly; the custom op's dispatch costs host time on the order of
    # a small backward's GPU time (the benchmark's N=1k step was host-bound through it).
    bwd = flash_attn_bwd_op if use_registered_op(dout, q, k, v, out, lse, dlse) else _backward_impl
    dq, dk, dv = bwd(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.sm_scale)
    return dq, dk, dv, None, None


flash_attn_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def flash_attn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    return_lse: bool = False,
):
    """Attention ``softmax(q k^T * sm_scale [+ mask]) v``; differentiable in q, k, v (and through the LSE).

    q ``(B, H, Nq, D)``, k/v ``(B, Hkv, Nk, D)`` with ``H % Hkv == 0`` (GQA/MQA), fp16/bf16/fp32, D a
    multiple of 8 up to 256, any strides. ``causal`` is bottom-right aligned (query i sees keys
    ``<= i + Nk - Nq``); this equals SDPA's ``is_causal`` only when Nq == Nk. Returns ``out`` (same
    shape/dtype as q), plus the natural-log LSE ``(B, H, Nq)`` fp32 when ``return_lse``.
    """
    _, scale = check_inputs(q, k, v, sm_scale)
    # No gradient needed (inference) and eager: skip the custom op's dispatch, which costs as much
    # host time as a decode-sized kernel; autograd and torch.compile go through the op.
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad or use_registered_op(q, k, v):
        out, lse = flash_attn_fwd_op(q, k, v, bool(causal), scale)
    else:
        out, lse = _forward_impl(q, k, v, bool(causal), scale)
    return (out, lse) if return_lse else out
