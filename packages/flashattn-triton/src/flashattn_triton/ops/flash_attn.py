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

from .._common import Backend, TuningTable, arch_key, check_same_device, check_tensor, select_backend

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
        return tl.zeros((), dtype=tl.int64), n


@triton.jit
def _fwd_block(
    acc, l_i, m_i, q, k_base, v_base, skn, svn, offs_m, offs_n, offs_d, lo, hi, seqlen_k, diag, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
):
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        kv_off = cols.to(tl.int64)
        if MASKED:
            n_ok = cols < seqlen_k
            kt = tl.load(k_base + kv_off[None, :] * skn + offs_d[:, None], mask=d_ok[:, None] & n_ok[None, :], other=0.0)
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
    Q, K, V, O, LSE, cu_q, cu_k,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som, slb, slh,
    H, GROUP, Nq, Nk, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
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
    d_ok = offs_d < HEAD_DIM
    q = tl.load(q_base + offs_m.to(tl.int64)[:, None] * sqm + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    full, hi = _causal_ranges(start_m, seqlen_k, diag, BLOCK_M, BLOCK_N, CAUSAL)
    # off-band tiles: no mask at all
    acc, l_i, m_i = _fwd_block(
        acc, l_i, m_i, q, k_base, v_base, skn, svn, offs_m, offs_n, offs_d, 0, full, seqlen_k, diag, qk_scale,
        HEAD_DIM, BLOCK_N, BLOCK_D, False, CAUSAL, DOT_PREC,
    )
    # diagonal band and ragged tail: masked
    acc, l_i, m_i = _fwd_block(
        acc, l_i, m_i, q, k_base, v_base, skn, svn, offs_m, offs_n, offs_d, full, hi, seqlen_k, diag, qk_scale,
        HEAD_DIM, BLOCK_N, BLOCK_D, True, CAUSAL, DOT_PREC,
    )
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(o_base + offs_m.to(tl.int64)[:, None] * som + offs_d[None, :], out.to(O.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    tl.store(LSE + b64 * slb + h.to(tl.int64) * slh + q_start + offs_m, lse, mask=m_ok)


# ---- split-KV decode -----------------------------------------------------------------------


@triton.jit
def _decode_split_kernel(
    Q, K, V, OPART, LPART,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn,
    Hkv, GROUP, Nq, Nk, chunk, num_splits, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """One program: all GROUP*Nq query rows of one KV head against one KV chunk (GQA packing)."""
    pid_bk = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid_bk // Hkv).to(tl.int64)
    hk = (pid_bk % Hkv).to(tl.int64)
    R = GROUP * Nq
    offs_r = tl.arange(0, BLOCK_R)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    r_ok = offs_r < R
    d_ok = offs_d < HEAD_DIM
    head = hk * GROUP + (offs_r // Nq)
    qi = offs_r % Nq
    q = tl.load(
        Q + b * sqb + head[:, None] * sqh + qi.to(tl.int64)[:, None] * sqm + offs_d[None, :],
        mask=r_ok[:, None] & d_ok[None, :], other=0.0,
    )
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    diag = Nk - Nq
    lo = split * chunk
    hi = tl.minimum(lo + chunk, Nk)
    if CAUSAL:
        hi = tl.minimum(hi, Nk)  # the last query sees every key; row masks handle the rest
    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        n_ok = cols < hi
        kv_off = cols.to(tl.int64)
        kt = tl.load(k_base + kv_off[None, :] * skn + offs_d[:, None], mask=d_ok[:, None] & n_ok[None, :], other=0.0)
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
        v = tl.load(v_base + kv_off[:, None] * svn + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
        m_i = m_new
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    row = (pid_bk * num_splits + split).to(tl.int64) * R + offs_r
    tl.store(OPART + row[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None], mask=r_ok[:, None] & d_ok[None, :])
    tl.store(LPART + row, m_i + tl.math.log2(l_i), mask=r_ok)  # log2 domain; -inf when empty


@triton.jit
def _decode_combine_kernel(
    OPART, LPART, O, LSE, sob, soh, som, slb, slh,
    Hkv, GROUP, Nq, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
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
    d_ok = offs_d < HEAD_DIM
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
    O, DO, DLSE, DELTA, cu_q,
    sob, soh, som, sdob, sdoh, sdom, slb, slh,
    H, Nq,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, VARLEN: tl.constexpr, HAS_DLSE: tl.constexpr,
):
    """delta = rowsum(dO * O) - dLSE (the LSE gradient folds into delta exactly)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
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
    mask = m_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    rows = (q_start + offs_m)[:, None]
    o = tl.load(O + b64 * sob + h * soh + rows * som + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + b64 * sdob + h * sdoh + rows * sdom + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    lrow = b64 * slb + h * slh + q_start + offs_m
    if HAS_DLSE:
        delta -= tl.load(DLSE + lrow, mask=m_ok, other=0.0)
    tl.store(DELTA + lrow, delta, mask=m_ok)


@triton.jit
def _bwd_dkdv_block(
    dk, dv, k, v, q_base, do_base, l_base, d_base, sqm, sdom, offs_n, offs_d, lo, hi, seqlen_q, diag, qk2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, DOT_PREC: tl.constexpr,
):
    d_ok = offs_d < HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_ok = offs_m < seqlen_q
        rows = offs_m.to(tl.int64)
        qt = tl.load(q_base + rows[None, :] * sqm + offs_d[:, None], mask=d_ok[:, None] & m_ok[None, :], other=0.0)
        # rows past the end get lse=+inf so p=0 there without an explicit mask
        lse2 = tl.load(l_base + offs_m, mask=m_ok, other=float("inf")) * 1.4426950408889634
        lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)  # rows that saw no key
        st = tl.dot(k, qt, input_precision=DOT_PREC) * qk2
        pt = tl.math.exp2(st - lse2[None, :])
        if MASKED:
            pt = tl.where(offs_m[None, :] + diag >= offs_n[:, None], pt, 0.0)
        do = tl.load(do_base + rows[:, None] * sdom + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=DOT_PREC)
        delta = tl.load(d_base + offs_m, mask=m_ok, other=0.0)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PREC)
        dst = pt * (dpt - delta[None, :])
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=DOT_PREC)
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, cu_q, cu_k,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, slb, slh,
    Hkv, GROUP, Nq, Nk, sm_scale, qk2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
):
    """dK, dV for one KV block, summed over every query head of its GQA group (no scratch, no atomics)."""
    pid_n = tl.program_id(0)
    pid_bk = tl.program_id(1)
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
    d_ok = offs_d < HEAD_DIM
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
    for g in range(0, GROUP):
        h = (hk * GROUP + g).to(tl.int64)
        q_base = Q + b64 * sqb + h * sqh + q_start * sqm
        do_base = DO + b64 * sdob + h * sdoh + q_start * sdom
        l_base = LSE + b64 * slb + h * slh + q_start
        d_base = DELTA + b64 * slb + h * slh + q_start
        if CAUSAL:
            dk, dv = _bwd_dkdv_block(
                dk, dv, k, v, q_base, do_base, l_base, d_base, sqm, sdom, offs_n, offs_d, lo, mid, seqlen_q, diag,
                qk2, HEAD_DIM, BLOCK_M, True, DOT_PREC,
            )
        dk, dv = _bwd_dkdv_block(
            dk, dv, k, v, q_base, do_base, l_base, d_base, sqm, sdom, offs_n, offs_d, mid, hi, seqlen_q, diag,
            qk2, HEAD_DIM, BLOCK_M, False, DOT_PREC,
        )
    dk = dk * sm_scale
    tl.store(DK + b64 * sdkb + hk.to(tl.int64) * sdkh + rows_n * sdkn + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b64 * sdvb + hk.to(tl.int64) * sdvh + rows_n * sdvn + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_block(
    dq, q, do, lse2, delta, k_base, v_base, skn, svn, offs_m, offs_n, offs_d, lo, hi, seqlen_k, diag, qk2,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
):
    d_ok = offs_d < HEAD_DIM
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
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, cu_q, cu_k,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom, sdqb, sdqh, sdqm, slb, slh,
    H, GROUP, Nq, Nk, sm_scale, qk2,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
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
    mask = m_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
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
        dq, q, do, lse2, delta, k_base, v_base, skn, svn, offs_m, offs_n, offs_d, 0, full, seqlen_k, diag, qk2,
        HEAD_DIM, BLOCK_N, False, CAUSAL, DOT_PREC,
    )
    dq = _bwd_dq_block(
        dq, q, do, lse2, delta, k_base, v_base, skn, svn, offs_m, offs_n, offs_d, full, hi, seqlen_k, diag, qk2,
        HEAD_DIM, BLOCK_N, True, CAUSAL, DOT_PREC,
    )
    dq = dq * sm_scale
    tl.store(DQ + b64 * sdqb + h * sdqh + rows * sdqm + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=mask)
