"""W8A8 int8 GEMM with the dequantization fused into the epilogue.

``C = (A_q @ B_q as int32) * sa[:, None] * sb[None, :] (+ bias)`` cast to ``out_dtype``.

* The int32 accumulator lives in registers; only the dequantized output is written
  (split-K writes int32 partials that a second kernel sums exactly, then dequantizes).
* A and B take any strides (passed to the kernel). The fast layout is A row-major (K
  contiguous) and B *K-major*, i.e. ``B_q = W_q.t()`` for an ``(N, K)`` contiguous weight:
  both operands then stream K-contiguous 16-byte vectors, which is what the tensor-core
  int8 MMA (wgmma on SM90, mma.sync on SM80/86) wants. A row-major ``(K, N)`` B is correct
  but slower (int8 operands of an MMA must be K-major in shared memory, so the compiler
  has to transpose the tile).
* Tile order is grouped (GROUP_M swizzle) for L2 reuse.
* Small M (decode) uses a small BLOCK_M plus split-K so the weight streams from every SM.
* Decode (M <= 16) on SM90 can instead run swap-AB (``"SWAP_AB": 1``): C^T = W . x^T, weight
  rows as the wgmma M dimension, the tokens (padded to 16 by TMA zero-fill) as its N, both
  operands streamed by multi-stage TMA (``_int8_gemm_swapab_kernel``).
* Large M on SM90 can run the warp-specialized persistent Gluon kernel (``"SM90": 1`` plus its
  ``SM90_*`` keys in a tuning entry; ``_gemm_sm90.py``, Triton 3.6 only): a TMA producer warp and
  two wgmma consumer warpgroups. Other Triton versions / GPUs / layouts keep the entry's old config.
* ``out_dtype=torch.int32`` returns the raw int32 product (``sa``/``sb``/``bias`` must be None),
  like ``torch._int_mm`` but without its M > 16 restriction.
* Configs come from ``tuning.json`` (arch -> M bucket [, N, K]); ``INT8_GEMM_AUTOTUNE=1``
  benchmarks a pruned candidate list once per (arch, M bucket, N, K, layout) instead.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

try:  # programmatic dependent launch (SM90+): safe no-ops when the launch is not a PDL one
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    gdc_wait = gdc_launch_dependents = None

try:  # host-side TMA descriptors (Triton >= 3.4); the TMA variant is skipped without them
    from triton.tools.tensor_descriptor import TensorDescriptor as _TensorDescriptor
except ImportError:  # pragma: no cover
    _TensorDescriptor = None

from .._common import Backend, TuningTable, arch_key, check_same_device, check_tensor, select_backend, use_registered_op
from .._common import direct as _direct
from .._common.device import num_sms
from .._common.shapes import cdiv
from . import _gemm_sm90
from .quantize import MIN_ABSMAX, _rne

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int32)
_TUNING_PATH = Path(__file__).resolve().parent.parent / "tuning.json"
_M_BUCKETS = ((1, 16), (17, 64), (65, 256), (257, 1024), (1025, 1 << 62))


@triton.jit
def _epilogue(
    acc,
    c_ptr,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    offs_m,
    offs_n,
    M,
    N,
    stride_cm,
    stride_cn,
    stride_sa,
    stride_sb,
    HAS_BIAS: tl.constexpr,
    OUT_INT32: tl.constexpr,
    sa_vals=0.0,
    SA_GIVEN: tl.constexpr = False,
):
    """int32 tile -> (acc * sa * sb + bias) in the output dtype, masked store. offs_* are int64.
    sa comes from sa_ptr, or from sa_vals (BLOCK_M,) when the kernel computed it (SA_GIVEN)."""
    mask_m = offs_m < M
    mask_n = offs_n < N
    mask = mask_m[:, None] & mask_n[None, :]
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if OUT_INT32:
        tl.store(c_ptrs, acc, mask=mask)
    else:
        if SA_GIVEN:
            sa = sa_vals
        else:
            sa = tl.load(sa_ptr + offs_m * stride_sa, mask=mask_m, other=0.0)
        sb = tl.load(sb_ptr + offs_n * stride_sb, mask=mask_n, other=0.0)
        c = acc.to(tl.float32) * sa[:, None] * sb[None, :]
        if HAS_BIAS:
            c += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(c_ptrs, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _splitk_last_sum(acc, ws_ptr, cnt_ptr, pid_k, tile, ws_off, mask, plane, SPLIT_K: tl.constexpr):
    """Split-K with the fused last-arrival reduction, shared by the split-K kernels: store this
    split's int32 partial tile at ws_ptr + pid_k * plane + ws_off, count the arrivals of output
    tile `tile` in cnt_ptr; the last of the SPLIT_K programs to arrive sums every partial in split
    order (deterministic, own partial included). Returns (is_last, that sum); the caller runs the
    epilogue when is_last and then resets cnt_ptr[tile] to 0 for the next launch."""
    tl.store(ws_ptr + pid_k.to(tl.int64) * plane + ws_off, acc, mask=mask)
    tl.debug_barrier()  # orders every thread's partial store before the atomic's release
    arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
    total = tl.zeros_like(acc)
    if arrived == SPLIT_K - 1:
        tl.debug_barrier()
        part_base = ws_ptr
        for _ in range(0, SPLIT_K):
            # .cg: read through L2, where the other SMs' partials are
            total += tl.load(part_base + ws_off, mask=mask, other=0, cache_modifier=".cg")
            part_base += plane
    return arrived == SPLIT_K - 1, total


@triton.jit
def _int8_gemm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    ws_ptr,
    cnt_ptr,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_sa,
    stride_sb,
    HAS_BIAS: tl.constexpr,
    OUT_INT32: tl.constexpr,
    A_K_CONTIG: tl.constexpr,
    B_K_CONTIG: tl.constexpr,
    B_N_CONTIG: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_M: tl.constexpr,
    EVEN_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    QUANT_A: tl.constexpr = False,
    MIN_AMAX: tl.constexpr = 1e-30,
    AMAX_ONE_ROW: tl.constexpr = False,
    AMAX_CHUNK: tl.constexpr = 1024,
    AMAX_NCHUNK: tl.constexpr = 0,
    PF_LINES: tl.constexpr = 0,
    PDL_WAIT: tl.constexpr = False,
    PDL_TRIGGER: tl.constexpr = 0,
    WS_I32: tl.constexpr = False,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M row-tiles sweep the N tiles together so B tiles stay in L2.
    num_in_group = GROUP_M * num_pid_n
    group_id = pid // num_in_group
    first_m = group_id * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % num_in_group) % group_size)
    pid_n = (pid % num_in_group) // group_size

    # Indices fit in int32 (each dim < 2**31); they become int64 before any stride product,
    # which can pass 2**31 for big operands. (An int64 `%` would be a slow call per element.)
    offs_m32 = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n32 = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Partial edge tiles wrap out-of-range rows/cols onto valid ones so operand loads need no
    # M/N mask (the garbage rows/cols are masked at the store). Contiguity hints only where they
    # hold (full tiles): they matter for a column-major A or row-major B, whose M/N is the
    # contiguous dim; a wrapped partial tile there loads element-wise.
    if EVEN_M:
        ram = tl.max_contiguous(tl.multiple_of(offs_m32, BLOCK_M), BLOCK_M).to(tl.int64)
    else:
        ram = (offs_m32 % M).to(tl.int64)
    if EVEN_N:
        rbn = tl.max_contiguous(tl.multiple_of(offs_n32, BLOCK_N), BLOCK_N).to(tl.int64)
    else:
        rbn = (offs_n32 % N).to(tl.int64)
    offs_m = offs_m32.to(tl.int64)
    offs_n = offs_n32.to(tl.int64)

    # Each split owns a BLOCK_K-aligned K range.
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = pid_k.to(tl.int64) * k_per_split
    offs_k = tl.arange(0, BLOCK_K)
    rk = k_start + offs_k
    blk = tl.full((), BLOCK_K, tl.int64)  # int64 pointer steps
    if A_K_CONTIG:
        a_ptrs = a_ptr + ram[:, None] * stride_am + rk[None, :]
        a_step = blk
    else:
        a_ptrs = a_ptr + ram[:, None] * stride_am + rk[None, :] * stride_ak
        a_step = blk * stride_ak
    if B_K_CONTIG:  # K-major B (W.t()): the fast layout
        b_ptrs = b_ptr + rk[:, None] + rbn[None, :] * stride_bn
        b_step = blk
    elif B_N_CONTIG:  # row-major (K, N) B
        b_ptrs = b_ptr + rk[:, None] * stride_bk + rbn[None, :]
        b_step = blk * stride_bk
    else:
        b_ptrs = b_ptr + rk[:, None] * stride_bk + rbn[None, :] * stride_bn
        b_step = blk * stride_bk

    if PF_LINES > 0:
        # Decode: ask L2 for this program's whole weight slab (K-major B: BLOCK_N rows x its K range,
        # one prefetch per 128-byte line) before anything that waits, so the slab streams from HBM
        # while the program waits for its activations (PDL) or computes their absmax (QUANT_A).
        k_end = tl.minimum(K, k_start + k_per_split) - 1
        pf_k = tl.minimum(k_start + tl.arange(0, PF_LINES).to(tl.int64) * 128, k_end)
        pf_ptrs = b_ptr + rbn[:, None] * stride_bn + pf_k[None, :]
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; // $0", "=r,l", [pf_ptrs], dtype=tl.int32, is_pure=False, pack=1
        )
    if PDL_TRIGGER == 2:
        gdc_launch_dependents()  # see _PDL_TRIGGER_DOC
    if PDL_WAIT:
        # Launched as a programmatic dependent of the activation quantizer: everything above only
        # reads the weight; A (and any global write) only after the quantizer's grid is done.
        gdc_wait()

    if QUANT_A:
        # Fused dynamic per-token quantization (decode): A is the float activation. Every program
        # reads its rows over the full K for the absmax (a few KB, L2-resident after the first
        # program), then quantizes each A tile in registers with the quantizer's math.
        if AMAX_ONE_ROW:
            # M == 1: one row, scanned in AMAX_NCHUNK unrolled chunks whose loads are independent,
            # so they are all in flight at once (a runtime loop pays one L2 latency per chunk).
            offs_c = tl.arange(0, AMAX_CHUNK)
            amax1 = tl.full((), 0.0, tl.float32)
            for c in tl.static_range(AMAX_NCHUNK):
                kk = offs_c + c * AMAX_CHUNK
                if A_K_CONTIG:
                    xa = tl.load(a_ptr + kk, mask=kk < K, other=0.0)
                else:
                    xa = tl.load(a_ptr + kk.to(tl.int64) * stride_ak, mask=kk < K, other=0.0)
                amax1 = tl.maximum(amax1, tl.max(tl.abs(xa.to(tl.float32)), axis=0))
            amax = tl.zeros((BLOCK_M,), dtype=tl.float32) + amax1
        else:
            a_rows = a_ptr + ram[:, None] * stride_am
            amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                kk = offs_k[None, :] + k0
                if A_K_CONTIG:
                    xa = tl.load(a_rows + kk, mask=kk < K, other=0.0)
                else:
                    xa = tl.load(a_rows + kk.to(tl.int64) * stride_ak, mask=kk < K, other=0.0)
                amax = tl.maximum(amax, tl.max(tl.abs(xa.to(tl.float32)), axis=1))
        amax = tl.maximum(amax, MIN_AMAX)
        a_inv = 127.0 / amax
        sa_vals = amax / 127.0
    else:
        sa_vals = 0.0

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    n_iters = tl.cdiv(tl.minimum(K - k_start, k_per_split), BLOCK_K)
    for it in range(0, n_iters):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k_start - it * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0)
        if QUANT_A:
            a = tl.minimum(tl.maximum(_rne(a.to(tl.float32) * a_inv[:, None]), -127.0), 127.0).to(tl.int8)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        a_ptrs += a_step
        b_ptrs += b_step
    if PDL_TRIGGER == 1:
        gdc_launch_dependents()

    if SPLIT_K == 1:
        _epilogue(
            acc, c_ptr, sa_ptr, sb_ptr, bias_ptr, offs_m, offs_n, M, N,
            stride_cm, stride_cn, stride_sa, stride_sb, HAS_BIAS, OUT_INT32, sa_vals, QUANT_A,
        )  # fmt: skip
    else:
        # int32 partials, summed exactly before any scaling. Scalar plane base + int32 tile offsets
        # (WS_I32: split*M*N < 2**31) instead of a 2-D tensor of 64-bit pointers, which stayed live
        # across the reduction and spilled (64x128 tiles: 255 registers + local memory on sm90).
        mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        if WS_I32:
            ws_off = offs_m32[:, None] * N + offs_n32[None, :]
        else:
            ws_off = offs_m[:, None] * N + offs_n[None, :]
        plane = (tl.full((), 0, tl.int64) + M) * N  # int64: M*N can pass 2**31
        if FUSED_REDUCE:
            # The last of the SPLIT_K programs of this tile to arrive sums the partials and runs
            # the epilogue: one launch instead of two (decode shapes are launch-bound).
            last, acc = _splitk_last_sum(acc, ws_ptr, cnt_ptr, pid_k, pid, ws_off, mask, plane, SPLIT_K)
            if last:
                _epilogue(
                    acc, c_ptr, sa_ptr, sb_ptr, bias_ptr, offs_m, offs_n, M, N,
                    stride_cm, stride_cn, stride_sa, stride_sb, HAS_BIAS, OUT_INT32, sa_vals, QUANT_A,
                )  # fmt: skip
                tl.atomic_xchg(cnt_ptr + pid, 0)  # self-reset for the next launch
        else:
            tl.store(ws_ptr + pid_k.to(tl.int64) * plane + ws_off, acc, mask=mask)


@triton.jit
def _dp4a(a, b, USE_ASM: tl.constexpr):
    """Per 32-bit lane: sum of the 4 signed int8 x int8 byte products. USE_ASM: the hardware dp4a
    (GPU); otherwise the same sum from sign-extended bytes (interpreter, and a reference)."""
    if USE_ASM:
        return tl.inline_asm_elementwise(
            "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, tl.zeros_like(a)], dtype=tl.int32, is_pure=True, pack=1
        )
    else:
        s = ((a << 24) >> 24) * ((b << 24) >> 24)
        s += ((a << 16) >> 24) * ((b << 16) >> 24)
        s += ((a << 8) >> 24) * ((b << 8) >> 24)
        s += (a >> 24) * (b >> 24)
        return s


@triton.jit
def _int8_gemv_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    ws_ptr,
    cnt_ptr,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_sa,
    stride_sb,
    HAS_BIAS: tl.constexpr,
    OUT_INT32: tl.constexpr,
    A_K_CONTIG: tl.constexpr,
    EVEN_K: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    QUANT_A: tl.constexpr = False,
    MIN_AMAX: tl.constexpr = 1e-30,
    AMAX_CHUNK: tl.constexpr = 1024,
    AMAX_NCHUNK: tl.constexpr = 0,
    WS_I32: tl.constexpr = False,
    DP4A: tl.constexpr = False,
    DP4A_ASM: tl.constexpr = False,
    PDL_WAIT: tl.constexpr = False,
    PDL_TRIGGER: tl.constexpr = 0,
):
    """Decode GEMV (M = ROWS <= 16, K-major weight): bandwidth-bound, so CUDA cores, not tensor
    cores. Program (pid_n, pid_k) streams BLOCK_N weight rows x its K range in wide contiguous int8
    chunks and multiplies each chunk with every activation row (the loaded weight tile is reused
    across rows) in int32. stride_bk must be 1 (B = W.t()); stride_bn is W's row stride.
    QUANT_A: A is the float activation; every program takes the per-row absmax over the full K
    (a few KB from L2) and quantizes its K slice with the quantizer's exact math (bit-identical)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n32 = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rbn = (offs_n32 % N).to(tl.int64)  # edge rows wrap onto valid ones: unmasked weight loads
    offs_n = offs_n32.to(tl.int64)
    offs_m32 = tl.arange(0, BLOCK_M)
    offs_m = offs_m32.to(tl.int64)
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_start = pid_k.to(tl.int64) * k_per_split
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = b_ptr + rbn[:, None] * stride_bn + (k_start + offs_k)[None, :]
    if A_K_CONTIG:
        a_ptrs = a_ptr + k_start + offs_k
        a_step = BLOCK_K
    else:
        a_ptrs = a_ptr + (k_start + offs_k) * stride_ak
        a_step = BLOCK_K * stride_ak
    if PDL_TRIGGER == 2:
        gdc_launch_dependents()  # see _PDL_TRIGGER_DOC
    if PDL_WAIT:
        # a programmatic dependent launch of the quantizer: x_q / sa only after its grid is done
        gdc_wait()

    if QUANT_A:
        if ROWS == 1:
            # unrolled chunks: independent loads, all in flight at once
            offs_c = tl.arange(0, AMAX_CHUNK)
            amax1 = tl.full((), 0.0, tl.float32)
            for c in tl.static_range(AMAX_NCHUNK):
                kk = offs_c + c * AMAX_CHUNK
                if A_K_CONTIG:
                    xa = tl.load(a_ptr + kk, mask=kk < K, other=0.0)
                else:
                    xa = tl.load(a_ptr + kk.to(tl.int64) * stride_ak, mask=kk < K, other=0.0)
                amax1 = tl.maximum(amax1, tl.max(tl.abs(xa.to(tl.float32)), axis=0))
            amax = tl.zeros((BLOCK_M,), dtype=tl.float32) + amax1
        else:
            offs_c = tl.arange(0, AMAX_CHUNK)
            a_rows = a_ptr + offs_m[:, None] * stride_am
            amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for k0 in range(0, K, AMAX_CHUNK):
                kk = offs_c[None, :] + k0
                mk = (offs_m32[:, None] < M) & (kk < K)
                if A_K_CONTIG:
                    xa = tl.load(a_rows + kk, mask=mk, other=0.0)
                else:
                    xa = tl.load(a_rows + kk.to(tl.int64) * stride_ak, mask=mk, other=0.0)
                amax = tl.maximum(amax, tl.max(tl.abs(xa.to(tl.float32)), axis=1))
        amax = tl.maximum(amax, MIN_AMAX)
        a_inv = 127.0 / amax
        sa_vals = amax / 127.0
    else:
        a_inv = tl.zeros((BLOCK_M,), dtype=tl.float32)
        sa_vals = 0.0

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    n_iters = tl.cdiv(tl.minimum(K - k_start, k_per_split), BLOCK_K)
    if DP4A:
        # 4 K values per 32-bit word (K % 4 == 0, word-aligned rows, checked by the plan): one
        # dp4a per 4 multiply-adds, so M = 16 stays bandwidth-bound instead of IMAD-bound.
        W4: tl.constexpr = BLOCK_K // 4
        offs_w = tl.arange(0, W4)
        b4_ptrs = (
            b_ptr.to(tl.pointer_type(tl.int32)) + rbn[:, None] * (stride_bn // 4) + (k_start // 4 + offs_w)[None, :]
        )
        if QUANT_A:
            offs_b = tl.arange(0, 4)
            x4_ptrs = a_ptr + k_start + offs_w[:, None] * 4 + offs_b[None, :]  # A_K_CONTIG required
            shifts = offs_b * 8
        else:
            x4_ptrs = a_ptr.to(tl.pointer_type(tl.int32)) + k_start // 4 + offs_w
        for it in range(0, n_iters):
            if EVEN_K:
                w = tl.load(b4_ptrs)
            else:
                w_ok = offs_w < (K - k_start - it * BLOCK_K) // 4
                w = tl.load(b4_ptrs, mask=w_ok[None, :], other=0)
            for m in tl.static_range(ROWS):
                if QUANT_A:
                    if EVEN_K:
                        xr = tl.load(x4_ptrs + m * stride_am)
                    else:
                        xr = tl.load(x4_ptrs + m * stride_am, mask=w_ok[:, None], other=0.0)
                    inv_m = tl.sum(tl.where(offs_m32 == m, a_inv, 0.0), axis=0)
                    q = tl.minimum(tl.maximum(_rne(xr.to(tl.float32) * inv_m), -127.0), 127.0)
                    # pack the 4 codes of each word (bytes do not overlap: the sum is an OR)
                    x4 = tl.sum((q.to(tl.int32) & 0xFF) << shifts[None, :], axis=1)
                else:
                    if EVEN_K:
                        x4 = tl.load(x4_ptrs + m * (stride_am // 4))
                    else:
                        x4 = tl.load(x4_ptrs + m * (stride_am // 4), mask=w_ok, other=0)
                s = tl.sum(_dp4a(w, tl.broadcast_to(x4[None, :], (BLOCK_N, W4)), DP4A_ASM), axis=1)
                if ROWS == 1:
                    acc += s[None, :]
                else:
                    acc = tl.where(offs_m32[:, None] == m, acc + s[None, :], acc)
            b4_ptrs += W4
            if QUANT_A:
                x4_ptrs += BLOCK_K
            else:
                x4_ptrs += W4
        n_iters = 0  # the generic loop below is skipped
    for it in range(0, n_iters):
        if EVEN_K:
            w = tl.load(b_ptrs)
        else:
            k_ok = offs_k < K - k_start - it * BLOCK_K
            w = tl.load(b_ptrs, mask=k_ok[None, :], other=0)
        w32 = w.to(tl.int32)
        for m in tl.static_range(ROWS):
            if EVEN_K:
                xr = tl.load(a_ptrs + m * stride_am)
            else:
                xr = tl.load(a_ptrs + m * stride_am, mask=k_ok, other=0)
            if QUANT_A:
                inv_m = tl.sum(tl.where(offs_m32 == m, a_inv, 0.0), axis=0)
                q = tl.minimum(tl.maximum(_rne(xr.to(tl.float32) * inv_m), -127.0), 127.0)
                x32 = q.to(tl.int8).to(tl.int32)
            else:
                x32 = xr.to(tl.int32)
            s = tl.sum(w32 * x32[None, :], axis=1)
            if ROWS == 1:
                acc += s[None, :]
            else:
                acc = tl.where(offs_m32[:, None] == m, acc + s[None, :], acc)
        b_ptrs += BLOCK_K
        a_ptrs += a_step
    if PDL_TRIGGER == 1:
        gdc_launch_dependents()

    if SPLIT_K == 1:
        _epilogue(
            acc, c_ptr, sa_ptr, sb_ptr, bias_ptr, offs_m, offs_n, M, N,
            stride_cm, stride_cn, stride_sa, stride_sb, HAS_BIAS, OUT_INT32, sa_vals, QUANT_A,
        )  # fmt: skip
    else:
        # int32 partials summed exactly by the last-arriving split (as in _int8_gemm_kernel)
        mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        if WS_I32:
            ws_off = offs_m32[:, None] * N + offs_n32[None, :]
        else:
            ws_off = offs_m[:, None] * N + offs_n[None, :]
        plane = (tl.full((), 0, tl.int64) + M) * N
        if FUSED_REDUCE:
            last, acc = _splitk_last_sum(acc, ws_ptr, cnt_ptr, pid_k, pid_n, ws_off, mask, plane, SPLIT_K)
            if last:
                _epilogue(
                    acc, c_ptr, sa_ptr, sb_ptr, bias_ptr, offs_m, offs_n, M, N,
                    stride_cm, stride_cn, stride_sa, stride_sb, HAS_BIAS, OUT_INT32, sa_vals, QUANT_A,
                )  # fmt: skip
                tl.atomic_xchg(cnt_ptr + pid_n, 0)
        else:
            tl.store(ws_ptr + pid_k.to(tl.int64) * plane + ws_off, acc, mask=mask)


@triton.jit
def _int8_gemm_tma_kernel(
    a_desc,
    b_desc,
    c_ptr,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_cm,
    stride_cn,
    stride_sa,
    stride_sb,
    NUM_PROGS,  # runtime: a grid-sized constexpr would recompile for every shape
    HAS_BIAS: tl.constexpr,
    OUT_INT32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EPI_SPLIT: tl.constexpr = 1,
    WARP_SPEC: tl.constexpr = False,
):
    """TMA variant (SM90+): operand tiles arrive by tensor-memory-accelerator copies (no per-thread
    address math, out-of-bounds rows/cols/K zero-filled by the hardware). A is (M, K) row-major,
    b_desc describes the (N, K) K-major weight. With NUM_PROGS < #tiles it is persistent: each
    program walks tiles NUM_PROGS apart in grouped order. EPI_SPLIT=2 runs the dequant epilogue
    on two (BLOCK_M, BLOCK_N/2) halves (fewer live fp32 registers at the store). WARP_SPEC asks
    Triton to warp-specialize the tile loop (producer warps issue TMA, consumers run wgmma)."""
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_in_group = GROUP_M * num_pid_n
    for tile in tl.range(start, num_tiles, NUM_PROGS, warp_specialize=WARP_SPEC):
        group_id = tile // num_in_group
        first_m = group_id * GROUP_M
        group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + ((tile % num_in_group) % group_size)
        pid_n = (tile % num_in_group) // group_size
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for ki in range(0, k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            b = b_desc.load([off_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
        offs_m = tl.arange(0, BLOCK_M).to(tl.int64) + off_m
        if EPI_SPLIT == 2:
            acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            offs_n0 = tl.arange(0, BLOCK_N // 2).to(tl.int64) + off_n
            _epilogue(
                acc0, c_ptr, sa_ptr, sb_ptr, bias_ptr, offs_m, offs_n0, M, N,
                stride_cm, stride_cn, stride_sa, stride_sb, HAS_BIAS, OUT_INT32,
            )  # fmt: skip
            _epilogue(
                acc1, c_ptr, sa_ptr, sb_ptr, bias_ptr, offs_m, offs_n0 + BLOCK_N // 2, M, N,
                stride_cm, stride_cn, stride_sa, stride_sb, HAS_BIAS, OUT_INT32,
            )  # fmt: skip
        else:
            offs_n = tl.arange(0, BLOCK_N).to(tl.int64) + off_n
            _epilogue(
                acc, c_ptr, sa_ptr, sb_ptr, bias_ptr, offs_m, offs_n, M, N,
                stride_cm, stride_cn, stride_sa, stride_sb, HAS_BIAS, OUT_INT32,
            )  # fmt: skip


@triton.jit
def _epilogue_t(
    acc,
    c_ptr,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    offs_n,
    offs_t,
    M,
    N,
    stride_cm,
    stride_cn,
    stride_sa,
    stride_sb,
    HAS_BIAS: tl.constexpr,
    OUT_INT32: tl.constexpr,
):
    """_epilogue for a transposed (BLOCK_N weight rows, BLOCK_T tokens) tile of C^T, stored into
    C (M, N). Same float math in the same order as _epilogue: (acc * sa) * sb (+ bias)."""
    mask_n = offs_n < N
    mask_t = offs_t < M
    mask = mask_n[:, None] & mask_t[None, :]
    c_ptrs = c_ptr + offs_t[None, :] * stride_cm + offs_n[:, None] * stride_cn
    if OUT_INT32:
        tl.store(c_ptrs, acc, mask=mask)
    else:
        sa = tl.load(sa_ptr + offs_t * stride_sa, mask=mask_t, other=0.0)
        sb = tl.load(sb_ptr + offs_n * stride_sb, mask=mask_n, other=0.0)
        c = acc.to(tl.float32) * sa[None, :] * sb[:, None]
        if HAS_BIAS:
            c += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
        tl.store(c_ptrs, c.to(c_ptr.dtype.element_ty), mask=mask)


# M is not specialized (M = 1, 8, 16 share one binary: every token count of a decode batch).
@triton.jit(do_not_specialize=["M"])
def _int8_gemm_swapab_kernel(
    w_desc,
    x_desc,
    c_ptr,
    ws_ptr,
    cnt_ptr,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_cm,
    stride_cn,
    stride_sa,
    stride_sb,
    HAS_BIAS: tl.constexpr,
    OUT_INT32: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    FUSED_REDUCE: tl.constexpr,
    PDL_WAIT: tl.constexpr = False,
    PDL_TRIGGER: tl.constexpr = 0,
    WS_I32: tl.constexpr = False,
):
    """Decode (M <= BLOCK_T tokens) as swap-AB: C^T (N, M) = W (N, K) . x^T, so the weight rows
    are the MMA's M dimension (wgmma m64 per warpgroup on SM90) and the few tokens its N dimension
    (BLOCK_T = 16): no MMA rows are wasted on padding tokens. Both operands arrive by TMA:
    w_desc is the (N, K) K-major weight in (BLOCK_N, BLOCK_K) boxes, x_desc the (M, K) row-major
    activation in (BLOCK_T, BLOCK_K) boxes, which is exactly the K-major B operand int8 wgmma
    needs (x.T). TMA zero-fills the token rows >= M, the weight rows >= N and the K tail, so the
    loop has no masks; the epilogue masks. Grid (N tiles, SPLIT_K): each split owns a range of
    whole K blocks; int32 partials go to ws (SPLIT_K, M, N) like _int8_gemm_kernel's, summed by the
    last-arriving split (FUSED_REDUCE) or by _splitk_reduce_kernel."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    off_n = pid_n * BLOCK_N
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    kt0 = pid_k * per_split
    kt1 = tl.minimum(kt0 + per_split, k_tiles)
    if PDL_TRIGGER == 2:
        gdc_launch_dependents()  # see _PDL_TRIGGER_DOC
    if PDL_WAIT:
        # Programmatic dependent of the quantizer: nothing is read or written before its grid is done
        # (the weight could stream earlier, but Triton's pipeliner owns the first TMA issues).
        gdc_wait()
    acc = tl.zeros((BLOCK_N, BLOCK_T), dtype=tl.int32)
    for kt in range(kt0, kt1):
        k = kt * BLOCK_K
        w = w_desc.load([off_n, k])
        x = x_desc.load([0, k])
        acc = tl.dot(w, x.T, acc, out_dtype=tl.int32)
    if PDL_TRIGGER == 1:
        gdc_launch_dependents()

    offs_n32 = off_n + tl.arange(0, BLOCK_N)
    offs_t32 = tl.arange(0, BLOCK_T)
    offs_n = offs_n32.to(tl.int64)
    offs_t = offs_t32.to(tl.int64)
    if SPLIT_K == 1:
        _epilogue_t(
            acc, c_ptr, sa_ptr, sb_ptr, bias_ptr, offs_n, offs_t, M, N,
            stride_cm, stride_cn, stride_sa, stride_sb, HAS_BIAS, OUT_INT32,
        )  # fmt: skip
    else:
        mask = (offs_n32 < N)[:, None] & (offs_t32 < M)[None, :]
        if WS_I32:
            ws_off = offs_t32[None, :] * N + offs_n32[:, None]
        else:
            ws_off = offs_t[None, :] * N + offs_n[:, None]
        plane = (tl.full((), 0, tl.int64) + M) * N
        if FUSED_REDUCE:
            last, acc = _splitk_last_sum(acc, ws_ptr, cnt_ptr, pid_k, pid_n, ws_off, mask, plane, SPLIT_K)
            if last:
                _epilogue_t(
                    acc, c_ptr, sa_ptr, sb_ptr, bias_ptr, offs_n, offs_t, M, N,
                    stride_cm, stride_cn, stride_sa, stride_sb, HAS_BIAS, OUT_INT32,
                )  # fmt: skip
                tl.atomic_xchg(cnt_ptr + pid_n, 0)  # self-reset for the next launch
        else:
            tl.store(ws_ptr + pid_k.to(tl.int64) * plane + ws_off, acc, mask=mask)


@triton.jit
def _splitk_reduce_kernel(
    ws_ptr,
    c_ptr,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    M,
    N,
    stride_cm,
    stride_cn,
    stride_sa,
    stride_sb,
    SPLIT_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    OUT_INT32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    ws_ptrs = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    plane = (tl.full((), 0, tl.int64) + M) * N  # int64: M*N can pass 2**31
    for _ in range(0, SPLIT_K):
        acc += tl.load(ws_ptrs, mask=mask, other=0)
        ws_ptrs += plane
    _epilogue(
        acc, c_ptr, sa_ptr, sb_ptr, bias_ptr, offs_m, offs_n, M, N,
        stride_cm, stride_cn, stride_sa, stride_sb, HAS_BIAS, OUT_INT32,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Config selection
# ----------------------------------------------------------------------------------------------


@functools.cache
def _table() -> TuningTable:
    return TuningTable.from_json(_TUNING_PATH)


def m_bucket(M: int) -> tuple[int, int]:
    for lo, hi in _M_BUCKETS:
        if lo <= M <= hi:
            return lo, hi
    return _M_BUCKETS[-1]


def _auto_split_k(M: int, N: int, K: int, cfg: dict[str, Any], num_sms: int) -> int:
    """Enough K splits that the grid covers the SMs ~2x, each split keeping >= 4 K-blocks."""
    tiles = cdiv(M, cfg["BLOCK_M"]) * cdiv(N, cfg["BLOCK_N"])
    k_blocks = cdiv(K, cfg["BLOCK_K"])
    split = 1
    while tiles * split < 2 * num_sms and k_blocks // (split * 2) >= 4 and split < 16:
        split *= 2
    return split


def _arch(device: torch.device) -> str:
    return arch_key(device)  # (cached per device in llmk_common)


def _sm_at_least(arch: str, sm: int) -> bool:
    """An arch key such as "sm90" names sm or newer ("cpu" and other keys: False)."""
    return arch.startswith("sm") and arch[2:].isdigit() and int(arch[2:]) >= sm


def _table_config(arch: str, M: int, N: int, K: int, b_kmajor: bool) -> dict[str, Any]:
    return _table().lookup(arch, M=M, N=N, K=K, b_kmajor=b_kmajor)  # memoized by the table


def _config_for(M: int, N: int, K: int, device: torch.device, b_kmajor: bool) -> dict[str, Any]:
    """Config for one call (the table lookup is memoized: decode calls this per token)."""
    arch = _arch(device)
    autotune = os.environ.get("INT8_GEMM_AUTOTUNE", "0") not in ("", "0")
    if autotune and device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        cfg = _autotuned(arch, M, N, K, b_kmajor, device.index or 0)
        if cfg is not None:
            return cfg
    return _table_config(arch, M, N, K, b_kmajor)


# Candidate space for the opt-in autotuner (and scripts/tune_int8.py): pruned per M bucket.
# SPLIT_K 0 = automatic; TMA = descriptor-based kernel (SM90+), PERSISTENT = programs per SM.
def candidate_configs(M: int, arch: str = "sm90") -> list[dict[str, Any]]:
    def c(bm, bn, bk, g, sk, w, s, **kw):
        return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=g, SPLIT_K=sk, num_warps=w, num_stages=s, **kw)

    tma = _sm_at_least(arch, 90)
    if M <= 16:
        return [
            c(16, 64, 256, 1, 0, 4, 4),
            c(16, 128, 256, 1, 0, 4, 4),
            c(16, 64, 512, 1, 0, 4, 3),
            c(16, 32, 256, 1, 0, 4, 5),
            c(16, 64, 128, 1, 0, 4, 6),
            c(16, 128, 128, 1, 0, 8, 5),
        ]
    if M <= 64:
        return [
            c(64, 64, 256, 1, 0, 4, 4),
            c(32, 64, 256, 1, 0, 4, 4),
            c(64, 128, 128, 1, 0, 4, 5),
            c(64, 128, 256, 1, 0, 4, 3),
            c(32, 128, 128, 1, 0, 4, 5),
        ]
    if M <= 256:
        return [
            c(64, 128, 128, 8, 0, 4, 5),
            c(128, 128, 128, 8, 0, 8, 4),
            c(64, 256, 128, 8, 0, 8, 4),
            c(128, 64, 128, 8, 0, 4, 5),
            c(128, 128, 128, 8, 1, 8, 4),
            c(64, 256, 128, 8, 1, 4, 4),
        ] + ([c(128, 128, 128, 8, 1, 8, 4, TMA=1), c(64, 256, 128, 8, 1, 4, 4, TMA=1)] if tma else [])
    cands = [
        c(128, 256, 128, 8, 1, 8, 3),
        c(128, 256, 128, 8, 1, 8, 4),
        c(128, 128, 128, 8, 1, 8, 4),
        c(256, 128, 128, 8, 1, 8, 3),
        c(128, 256, 64, 8, 1, 8, 5),
    ]
    if tma:
        cands += [
            c(128, 256, 128, 8, 1, 8, 3, TMA=1),
            c(128, 256, 128, 8, 1, 8, 4, TMA=1),
            c(128, 256, 128, 8, 1, 8, 3, TMA=1, PERSISTENT=1),
            c(128, 256, 128, 8, 1, 8, 4, TMA=1, PERSISTENT=1),
            c(256, 128, 128, 8, 1, 8, 3, TMA=1),
            c(128, 128, 128, 8, 1, 8, 4, TMA=1, PERSISTENT=2),
        ]
    return cands


_AUTOTUNE_CACHE: dict[tuple, dict[str, Any] | None] = {}


def _autotuned(arch, M, N, K, b_kmajor, index) -> dict[str, Any] | None:
    """Benchmark the candidates once per (arch, M bucket, N, K, layout); None if all fail."""
    key = (arch, m_bucket(M), N, K, b_kmajor)
    if key in _AUTOTUNE_CACHE:
        return _AUTOTUNE_CACHE[key]
    import triton.testing as tt

    dev = torch.device("cuda", index)
    a = torch.randint(-127, 128, (M, K), dtype=torch.int8, device=dev)
    w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device=dev)
    b = w.t() if b_kmajor else w.t().contiguous()
    sa = torch.rand(M, device=dev) * 1e-3
    sb = torch.rand(N, device=dev) * 1e-3
    best, best_ms = None, float("inf")
    for cfg in candidate_configs(M, arch):
        try:
            ms = tt.do_bench(lambda cfg=cfg: _launch(a, b, sa, sb, None, torch.float16, cfg), warmup=5, rep=20)
        except Exception:  # a config can fail to compile (e.g. shared memory)
            continue
        if ms < best_ms:
            best, best_ms = cfg, ms
    _AUTOTUNE_CACHE[key] = best
    return best


# ----------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------


_COUNTERS: dict[tuple, torch.Tensor] = {}
_COUNTER_SLOTS = 8
_SLOT_OF: dict[int, int] = {}
_RETIRED: list[torch.Tensor] = []


def _tile_counters(device: torch.device, n: int) -> torch.Tensor | None:
    """Zeroed int32 arrival counters for the fused split-K reduction, one per output tile.

    Kernels reset every counter they touch, so one zeroed buffer per device is reused forever.
    It has 8 slots, handed to streams round-robin, so split-K GEMMs running concurrently on
    different streams do not share counters (two streams sharing a slot, i.e. 8 streams apart,
    must not run split-K GEMMs at the same time; ``"FUSED_REDUCE": false`` in the config avoids
    the counters). A CUDA-graph capture stream gets its own slot of the buffer made before the
    capture. Returns None (use the two-kernel reduction) when the buffer would have to be created
    or grown during capture. Replaced buffers are kept alive: a kernel on another stream may
    still be using them.
    """
    if device.type == "cuda":
        key = (device.index,)
        stream = torch._C._cuda_getCurrentRawStream(device.index)  # the cheap form of current_stream
        slot = _SLOT_OF.get(stream)
        if slot is None:
            slot = _SLOT_OF.setdefault(stream, len(_SLOT_OF) % _COUNTER_SLOTS)  # round-robin per new stream
    else:
        key, slot = ("cpu",), 0
    buf = _COUNTERS.get(key)
    if buf is None or buf.shape[1] < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        if buf is not None:
            _RETIRED.append(buf)
        buf = torch.zeros((_COUNTER_SLOTS, max(n, 4096)), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf[slot]


def _tma_ok(A: torch.Tensor, B: torch.Tensor) -> bool:
    """TMA needs 16-byte aligned bases and row strides and unit inner strides (K-major B)."""
    if _TensorDescriptor is None:
        return False
    return (
        A.stride(1) == 1
        and B.stride(0) == 1
        and A.stride(0) % 16 == 0
        and B.stride(1) % 16 == 0
        and A.data_ptr() % 16 == 0
        and B.data_ptr() % 16 == 0
    )


class _Plan:
    """Everything about one launch that depends only on the shape/stride/dtype key (see _plan_key):
    the config, grid, split-K and the constexpr/launch keyword arguments. Built once per key, so a
    repeated call (every decode step) does no config lookup or arithmetic, only the launch."""

    __slots__ = ("kind", "grid", "kw", "split_k", "fused", "num_tiles", "tma", "reduce_grid", "cfg", "key", "dl", "dl2")

    def __init__(self) -> None:
        self.dl = _direct.Direct()  # direct launch of the main kernel (_common/direct.py)
        self.dl2 = _direct.Direct()  # ... and of the split-K reduction kernel


_PLANS: dict[tuple, _Plan] = {}


# _PDL_TRIGGER_DOC. ``pdl`` of _launch: 0 = an ordinary launch; 1 = a programmatic dependent launch (PDL)
# whose kernel waits (griddepcontrol.wait) before it touches x / x_q / sa or writes anything; 2 / 3 = the
# same, and the kernel also lets the *next* PDL launch on the stream start (griddepcontrol.launch_dependents)
# after its main loop (2) or at its start (3). A dependent so started still waits for this whole grid before
# it reads anything, so the trigger only moves its launch and setup earlier (ops/linear.py PDL_CHAIN).
def _pdl_trigger(pdl: int) -> int:
    """PDL_TRIGGER of the kernels: 0 none, 1 after the main loop, 2 at the start."""
    return max(0, int(pdl) - 1)


_GEMV_MAX_M = 16  # "GEMV": 1 configs apply up to this M (larger M: the tensor-core kernel)
_AMAX_CHUNK_MAX = 4096  # M == 1 fused quantization: absmax chunk (elements) per unrolled load
_MAX_PLANS = 4096


def _plan_key(A, B, sa, sb, bias, out_dtype, cfg, quant_a, pdl) -> tuple:
    # _config_for itself is part of the key so that replacing it (tests, tools) takes effect.
    return (
        A.shape,
        A.stride(),
        B.shape[1],
        B.stride(),
        A.dtype,
        out_dtype,
        None if sa is None else sa.stride(0),
        None if sb is None else sb.stride(0),
        bias is None,
        A.device,
        quant_a,
        pdl,
        _config_for if cfg is None else tuple(cfg.items()),
    )


def _make_plan(A, B, sa, sb, bias, out_dtype, cfg, quant_a, pdl, allow_fused=True) -> _Plan:
    M, K = A.shape
    N = B.shape[1]
    p = _Plan()
    p.kind = "std"
    if M == 0 or N == 0 or K == 0:
        p.kind = "empty"
        return p
    on_gpu = A.device.type == "cuda"
    b_kmajor = B.stride(0) == 1
    if cfg is None:
        cfg = _config_for(M, N, K, A.device, b_kmajor)
    p.cfg = cfg
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    split_k = int(cfg.get("SPLIT_K", 1))
    if split_k <= 0:
        split_k = _auto_split_k(M, N, K, cfg, num_sms(A.device) if on_gpu else 4)
    split_k = max(1, min(split_k, cdiv(K, bk)))  # never below one K block per split
    out_int32 = out_dtype == torch.int32
    common = dict(
        HAS_BIAS=bias is not None,
        OUT_INT32=out_int32,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=cfg.get("GROUP_M", 8),
    )
    if cfg.get("GEMV", 0) and b_kmajor and M <= _GEMV_MAX_M:
        return _gemv_plan(p, A, B, cfg, M, N, K, bias, out_dtype, quant_a, on_gpu, allow_fused, pdl)
    if cfg.get("SWAP_AB", 0):
        if _swapab_eligible(A, b_kmajor, M, quant_a, on_gpu):
            return _swapab_plan(p, A, cfg, M, N, K, bias, out_dtype, on_gpu, allow_fused, pdl)
        return _make_plan(A, B, sa, sb, bias, out_dtype, _SWAPAB_FALLBACK, quant_a, pdl, allow_fused)
    p.num_tiles = cdiv(M, bm) * cdiv(N, bn)
    if cfg.get("SM90", 0) and b_kmajor and not quant_a and not pdl and _gemm_sm90.eligible(A, B.t(), False):
        # the Gluon kernel (K-major B only); its tiles are the SM90_* keys, the rest of cfg is the fallback
        _gemm_sm90.resolve(cfg)  # a bad entry fails here, at plan time, not in the compiler
        p.kind = "sm90"
        p.split_k, p.fused = 1, False
        return p
    if cfg.get("TMA", 0) and split_k == 1 and not quant_a and not pdl and _TensorDescriptor is not None:
        p.kind = "tma"
        progs = p.num_tiles
        if cfg.get("PERSISTENT", 0) and on_gpu:
            progs = min(p.num_tiles, num_sms(A.device) * int(cfg.get("PERSISTENT", 1)))
        p.grid = (progs,)
        p.tma = (bm, bn, bk, progs)
        p.kw = dict(common, num_warps=cfg.get("num_warps", 8), num_stages=cfg.get("num_stages", 3))
        if cfg.get("EPI_SPLIT", 1) != 1:
            p.kw["EPI_SPLIT"] = int(cfg["EPI_SPLIT"])
        if cfg.get("WARP_SPEC", 0):
            p.kw["WARP_SPEC"] = True
        p.split_k, p.fused = 1, False
        return p
    fused = split_k > 1 and cfg.get("FUSED_REDUCE", True) and allow_fused
    if quant_a and split_k > 1 and not fused:
        split_k = 1  # the two-kernel reduction needs sa in memory; the fused one has it in registers
    p.split_k, p.fused = split_k, fused
    p.grid = (p.num_tiles, split_k)
    kw = dict(
        common,
        A_K_CONTIG=A.stride(1) == 1,
        B_K_CONTIG=b_kmajor,
        B_N_CONTIG=B.stride(1) == 1,
        EVEN_K=K % (bk * split_k) == 0,
        EVEN_M=M % bm == 0,
        EVEN_N=N % bn == 0,
        SPLIT_K=split_k,
        FUSED_REDUCE=fused,
        QUANT_A=quant_a,
        MIN_AMAX=MIN_ABSMAX,
        num_warps=cfg.get("num_warps", 4),
        num_stages=cfg.get("num_stages", 3),
    )
    if quant_a and M == 1:
        chunk = min(_AMAX_CHUNK_MAX, triton.next_power_of_2(K))
        kw.update(AMAX_ONE_ROW=True, AMAX_CHUNK=chunk, AMAX_NCHUNK=cdiv(K, chunk))
    # Decode-only options, GPU only (inline PTX / PDL have no interpreter form).
    if cfg.get("PREFETCH", 0) and b_kmajor and on_gpu:
        k_per_split = cdiv(cdiv(K, bk), split_k) * bk
        kw["PF_LINES"] = triton.next_power_of_2(cdiv(k_per_split, 128))
    if pdl and on_gpu:
        kw.update(PDL_WAIT=True, launch_pdl=True, PDL_TRIGGER=_pdl_trigger(pdl))
    if split_k > 1 and split_k * M * N < 2**31:
        kw["WS_I32"] = True
    p.kw = kw
    p.reduce_grid = (cdiv(M, 32), cdiv(N, 128)) if split_k > 1 and not fused else None
    return p


def _gemv_split_k(N: int, K: int, bn: int, bk: int, num_sms: int) -> int:
    """Enough K splits that the GEMV grid covers the SMs ~2x, each split keeping >= 2 K-blocks."""
    tiles = cdiv(N, bn)
    k_blocks = cdiv(K, bk)
    split = 1
    while tiles * split < 2 * num_sms and k_blocks // (split * 2) >= 2 and split < 16:
        split *= 2
    return split


def _gemv_plan(p, A, B, cfg, M, N, K, bias, out_dtype, quant_a, on_gpu, allow_fused, pdl=False) -> _Plan:
    """GEMV ("GEMV": 1, M <= 16, K-major B): grid (N tiles, SPLIT_K). pdl: launched as a programmatic
    dependent of the quantizer (waits before it reads x_q; SM90+, not with quant_a)."""
    p.kind = "gemv"
    bn, bk = cfg["BLOCK_N"], cfg["BLOCK_K"]
    split_k = int(cfg.get("SPLIT_K", 1))
    if split_k <= 0:
        split_k = _gemv_split_k(N, K, bn, bk, num_sms(A.device) if on_gpu else 4)
    split_k = max(1, min(split_k, cdiv(K, bk)))
    fused = split_k > 1 and cfg.get("FUSED_REDUCE", True) and allow_fused
    if quant_a and split_k > 1 and not fused:
        split_k = 1  # the two-kernel reduction needs sa in memory
    p.split_k, p.fused = split_k, fused
    p.num_tiles = cdiv(N, bn)
    p.grid = (p.num_tiles, split_k)
    kw = dict(
        HAS_BIAS=bias is not None,
        OUT_INT32=out_dtype == torch.int32,
        A_K_CONTIG=A.stride(1) == 1,
        EVEN_K=K % (bk * split_k) == 0,
        ROWS=M,
        BLOCK_M=triton.next_power_of_2(M),
        BLOCK_N=bn,
        BLOCK_K=bk,
        SPLIT_K=split_k,
        FUSED_REDUCE=fused,
        QUANT_A=quant_a,
        MIN_AMAX=MIN_ABSMAX,
        num_warps=cfg.get("num_warps", 4),
        num_stages=cfg.get("num_stages", 1),
    )
    if quant_a:
        if M == 1:
            chunk = min(_AMAX_CHUNK_MAX, triton.next_power_of_2(K))
            kw.update(AMAX_CHUNK=chunk, AMAX_NCHUNK=cdiv(K, chunk))
        else:
            kw["AMAX_CHUNK"] = min(triton.next_power_of_2(K), max(16, 4096 // triton.next_power_of_2(M)))
    if split_k > 1 and split_k * M * N < 2**31:
        kw["WS_I32"] = True
    if cfg.get("DP4A", 0) and _dp4a_ok(A, B, K, bk, quant_a):
        kw.update(DP4A=True, DP4A_ASM=on_gpu)
    if pdl and on_gpu and not quant_a and gdc_wait is not None:
        kw.update(PDL_WAIT=True, launch_pdl=True, PDL_TRIGGER=_pdl_trigger(pdl))
    p.kw = kw
    p.reduce_grid = (cdiv(M, 32), cdiv(N, 128)) if split_k > 1 and not fused else None
    return p


_SWAPAB_MAX_M = 16  # tokens per swap-AB program: the wgmma N dimension (BLOCK_T)
# A "SWAP_AB": 1 entry on a call the swap-AB kernel cannot take (pre-SM90 GPU, M > 16, row-major B,
# fused quantization, TMA-unaligned operands) runs the pointer kernel with the shipped generic
# sm90 M <= 16 config instead (the entry's own tiles/stages may not fit the pointer kernel's smem).
_SWAPAB_FALLBACK = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_M=1, SPLIT_K=0, num_warps=4, num_stages=4)


def _swapab_eligible(A, b_kmajor, M, quant_a, on_gpu) -> bool:
    if not b_kmajor or quant_a or M > _SWAPAB_MAX_M or _TensorDescriptor is None:
        return False
    if not on_gpu:
        return True  # the interpreter (CPU tests) runs the descriptor loads
    return _sm_at_least(_arch(A.device), 90)


def _swapab_tma_ok(A: torch.Tensor, B: torch.Tensor) -> bool:
    """Per-call TMA facts not in the plan key: 16-byte aligned bases and row strides. A single
    token row's stride is never used (it gets a rounded-up one in its descriptor)."""
    return (
        A.stride(1) == 1
        and B.stride(0) == 1
        and (A.stride(0) % 16 == 0 or A.shape[0] == 1)
        and B.stride(1) % 16 == 0
        and A.data_ptr() % 16 == 0
        and B.data_ptr() % 16 == 0
    )


def _swapab_split_k(N: int, K: int, bn: int, bk: int, num_sms: int) -> int:
    """Decode streams the weight once: about one wave of programs (tiles * split <= 1.25 x SMs),
    each split keeping >= 2 K-blocks so the TMA pipeline has something to overlap."""
    tiles = cdiv(N, bn)
    k_blocks = cdiv(K, bk)
    split = 1
    while tiles * split * 2 <= num_sms + num_sms // 4 and k_blocks // (split * 2) >= 2 and split < 16:
        split *= 2
    return split


def _swapab_plan(p, A, cfg, M, N, K, bias, out_dtype, on_gpu, allow_fused, pdl) -> _Plan:
    """Swap-AB decode ("SWAP_AB": 1; M <= 16, K-major B, SM90): grid (N / BLOCK_N, SPLIT_K) of
    _int8_gemm_swapab_kernel; BLOCK_N = weight rows per program (a multiple of 64: wgmma M)."""
    p.kind = "swapab"
    bn, bk = cfg["BLOCK_N"], cfg["BLOCK_K"]
    split_k = int(cfg.get("SPLIT_K", 1))
    if split_k <= 0:
        split_k = _swapab_split_k(N, K, bn, bk, num_sms(A.device) if on_gpu else 4)
    split_k = max(1, min(split_k, cdiv(K, bk)))
    fused = split_k > 1 and cfg.get("FUSED_REDUCE", True) and allow_fused
    p.split_k, p.fused = split_k, fused
    p.num_tiles = cdiv(N, bn)
    p.grid = (p.num_tiles, split_k)
    p.tma = (bn, _SWAPAB_MAX_M, bk)
    kw = dict(
        HAS_BIAS=bias is not None,
        OUT_INT32=out_dtype == torch.int32,
        BLOCK_N=bn,
        BLOCK_T=_SWAPAB_MAX_M,
        BLOCK_K=bk,
        SPLIT_K=split_k,
        FUSED_REDUCE=fused,
        num_warps=cfg.get("num_warps", 4),
        num_stages=cfg.get("num_stages", 4),
    )
    if pdl and on_gpu:
        kw.update(PDL_WAIT=True, launch_pdl=True, PDL_TRIGGER=_pdl_trigger(pdl))
    if split_k > 1 and split_k * M * N < 2**31:
        kw["WS_I32"] = True
    p.kw = kw
    p.reduce_grid = (cdiv(M, 32), cdiv(N, 128)) if split_k > 1 and not fused else None
    return p


def _dp4a_ok(A, B, K, bk, quant_a) -> bool:
    """dp4a GEMV reads the weight (and an int8 x) as 32-bit words: K % 4 == 0 and word-aligned
    rows; x must be K-contiguous. Alignment of the base pointers is part of the plan key."""
    if K % 4 or bk % 4 or B.stride(1) % 4 or A.stride(1) != 1:
        return False
    return quant_a or A.stride(0) % 4 == 0


def _get_plan(A, B, sa, sb, bias, out_dtype, cfg, quant_a, pdl) -> _Plan:
    key = _plan_key(A, B, sa, sb, bias, out_dtype, cfg, quant_a, pdl)
    p = _PLANS.get(key)
    if p is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        p = _make_plan(A, B, sa, sb, bias, out_dtype, cfg, quant_a, pdl)
        p.key = key
        _PLANS[key] = p
    return p


def _launch(
    A: torch.Tensor,
    B: torch.Tensor,
    sa: torch.Tensor | None,
    sb: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    cfg: dict[str, Any] | None = None,
    quant_a: bool = False,
    pdl: int = 0,
) -> torch.Tensor:
    """Launch the GEMM. quant_a: A is the float activation, quantized per row inside the kernel
    (sa must be None; the kernel derives it). pdl (0-3, see _PDL_TRIGGER_DOC): launch as a programmatic
    dependent of the previous kernel (the activation quantizer): only the weight may be read before
    its grid is done, so it is only for operands the previous kernel does not write."""
    M, K = A.shape
    N = B.shape[1]
    p = _get_plan(A, B, sa, sb, bias, out_dtype, cfg, quant_a, pdl)
    out = torch.empty((M, N), dtype=out_dtype, device=A.device)
    if p.kind == "empty":
        if M == 0 or N == 0:
            return out
        return out.zero_() if bias is None else out.copy_(bias.to(out_dtype).expand(M, N))
    dummy = out  # never dereferenced when the matching constexpr flag is off
    sa_t = dummy if sa is None else sa
    sb_t = dummy if sb is None else sb
    bias_t = dummy if bias is None else bias
    if p.kind == "sm90":
        if _gemm_sm90.aligned(A, B):  # (B.t()'s base is B's)
            _gemm_sm90.launch(A, B.t(), sa, sb, bias, out, out_dtype == torch.int32, p.cfg)
            return out
        # misaligned operands of an SM90-configured shape: the entry's other kernel (TMA or pointer)
        p = _get_plan(A, B, sa, sb, bias, out_dtype, _without_sm90(p.cfg), quant_a, pdl)
    if p.kind == "tma":
        if _tma_ok(A, B):
            bm, bn, bk, progs = p.tma
            args = (
                _TensorDescriptor(A, [M, K], [A.stride(0), 1], [bm, bk]),
                _TensorDescriptor(B.t(), [N, K], [B.stride(1), 1], [bn, bk]),  # the (N, K) weight
                out, sa_t, sb_t, bias_t, M, N, K, out.stride(0), out.stride(1),
                0 if sa is None else sa.stride(0), 0 if sb is None else sb.stride(0), progs,
            )  # fmt: skip
            align = (sa_t.data_ptr() % 16, sb_t.data_ptr() % 16, bias_t.data_ptr() % 16, bias_t.dtype)
            _direct.launch(p.dl, _int8_gemm_tma_kernel, p.grid, args, p.kw, align)
            return out
        # misaligned operands of a TMA-configured shape: the pointer kernel, same tiles
        cfg_nt = {k: v for k, v in p.cfg.items() if k not in ("TMA", "PERSISTENT", "EPI_SPLIT", "WARP_SPEC")}
        p = _get_plan(A, B, sa, sb, bias, out_dtype, cfg_nt, quant_a, pdl)
    if p.kind == "swapab" and not _swapab_tma_ok(A, B):  # e.g. an odd-strided view: pointer kernel
        p = _get_plan(A, B, sa, sb, bias, out_dtype, _SWAPAB_FALLBACK, quant_a, pdl)
    if p.kind == "gemv" and p.kw.get("DP4A") and (B.data_ptr() % 4 or (not quant_a and A.data_ptr() % 4)):
        # word loads need 4-byte aligned bases (not in the plan key): the byte-wise GEMV, uncached
        p = _make_plan(A, B, sa, sb, bias, out_dtype, dict(p.cfg, DP4A=0), quant_a, pdl)
    counters = dummy
    if p.fused:
        counters = _tile_counters(A.device, p.num_tiles)
        if counters is None:  # capture would have to allocate: two-kernel reduction, uncached
            p = _make_plan(A, B, sa, sb, bias, out_dtype, p.cfg, quant_a, pdl, allow_fused=False)
            counters = dummy
    ws = torch.empty((p.split_k, M, N), dtype=torch.int32, device=A.device) if p.split_k > 1 else dummy
    if p.kind == "swapab":
        bn, bt, bk = p.tma
        x_rs = A.stride(0) if M > 1 else cdiv(K, 16) * 16  # one row: its stride is never used
        args = (
            _TensorDescriptor(B.t(), [N, K], [B.stride(1), 1], [bn, bk]),  # the (N, K) weight
            _TensorDescriptor(A, [M, K], [x_rs, 1], [bt, bk]),  # tokens >= M: zero-filled rows
            out, ws, counters, sa_t, sb_t, bias_t, M, N, K, out.stride(0), out.stride(1),
            0 if sa is None else sa.stride(0), 0 if sb is None else sb.stride(0),
        )  # fmt: skip
        align = (counters.data_ptr() % 16, sa_t.data_ptr() % 16, sb_t.data_ptr() % 16, bias_t.data_ptr() % 16)
        _direct.launch(p.dl, _int8_gemm_swapab_kernel, p.grid, args, p.kw, align + (bias_t.dtype,))
        if p.reduce_grid is not None:
            _launch_reduce(p, ws, out, sa, sb, bias, sa_t, sb_t, bias_t, out_dtype, align[1:] + (bias_t.dtype,))
        return out
    args = (
        A, B, out, ws, counters, sa_t, sb_t, bias_t, M, N, K,
        A.stride(0), A.stride(1), B.stride(0), B.stride(1), out.stride(0), out.stride(1),
        0 if sa is None else sa.stride(0), 0 if sb is None else sb.stride(0),
    )  # fmt: skip
    # pointer alignment + bias dtype: the specialization facts the plan key does not pin
    align = (
        A.data_ptr() % 16, B.data_ptr() % 16, counters.data_ptr() % 16,
        sa_t.data_ptr() % 16, sb_t.data_ptr() % 16, bias_t.data_ptr() % 16, bias_t.dtype,
    )  # fmt: skip
    kernel = _int8_gemv_kernel if p.kind == "gemv" else _int8_gemm_kernel
    _direct.launch(p.dl, kernel, p.grid, args, p.kw, align)
    if p.reduce_grid is not None:
        _launch_reduce(p, ws, out, sa, sb, bias, sa_t, sb_t, bias_t, out_dtype, align[3:])
    return out


def _without_sm90(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if not k.startswith("SM90")}


def _launch_reduce(p, ws, out, sa, sb, bias, sa_t, sb_t, bias_t, out_dtype, align) -> None:
    """The two-kernel split-K reduction: sum the int32 partials of ws (SPLIT_K, M, N), dequantize."""
    M, N = out.shape
    _direct.launch(
        p.dl2, _splitk_reduce_kernel, p.reduce_grid,
        (ws, out, sa_t, sb_t, bias_t, M, N, out.stride(0), out.stride(1),
         0 if sa is None else sa.stride(0), 0 if sb is None else sb.stride(0)),
        dict(SPLIT_K=p.split_k, HAS_BIAS=bias is not None, OUT_INT32=out_dtype == torch.int32,
             BLOCK_M=32, BLOCK_N=128, num_warps=4),
        align,
    )  # fmt: skip


def _gemm_torch(A, B, sa, sb, bias, out_dtype) -> torch.Tensor:
    """Reference / fallback path (any device without a Triton kernel). The products are summed in
    float64 (BLAS and cuBLAS have it, CUDA has no int64 matmul): exact while |sum| < 2**53, i.e. any
    K below 2**38; the int32 result wraps like the kernels' accumulator only past K ~ 2**17."""
    acc = (A.to(torch.float64) @ B.to(torch.float64)).to(torch.int64).to(torch.int32)
    if out_dtype == torch.int32:
        return acc
    c = acc.to(torch.float32) * sa[:, None] * sb[None, :]
    if bias is not None:
        c = c + bias.float()[None, :]
    return c.to(out_dtype)


def _gemm_dequant_impl(
    A: torch.Tensor,
    B: torch.Tensor,
    sa: torch.Tensor | None,
    sb: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    if select_backend(A.device) is Backend.TORCH:
        return _gemm_torch(A, B, sa, sb, bias, out_dtype)
    return _launch(A, B, sa, sb, bias, out_dtype)


_gemm_dequant_op = torch.library.custom_op("int8_gemm::gemm_dequant", _gemm_dequant_impl, mutates_args=())


@_gemm_dequant_op.register_fake
def _(A, B, sa, sb, bias, out_dtype):
    return A.new_empty((A.shape[0], B.shape[1]), dtype=out_dtype)


# ----------------------------------------------------------------------------------------------
# Public entry point + checks
# ----------------------------------------------------------------------------------------------


def _norm_scale(name: str, s: Any, n: int, device: torch.device) -> torch.Tensor:
    """Scales as a 1-D fp32 vector of length n (a stride-0 view for scalars, no copy)."""
    if type(s) is torch.Tensor and s.dtype == torch.float32 and s.dim() == 1 and s.shape[0] == n and s.device == device:
        return s  # the common case, checked cheaply (decode calls this every token)
    if isinstance(s, (int, float)):
        return torch.full((1,), float(s), dtype=torch.float32, device=device).expand(n)
    check_tensor(name, s, dtypes=(torch.float32, torch.float16, torch.bfloat16))
    if s.device != device:
        raise ValueError(f"{name} is on {s.device} but A_q is on {device}; all tensors must share a device")
    if s.numel() == 1:
        return s.reshape(1).float().expand(n)
    if s.dim() == 1 and s.shape[0] == n:
        v = s
    elif s.dim() == 2 and s.shape[0] == n and s.shape[1] == 1:
        v = s[:, 0]
    elif s.dim() == 2 and s.shape[0] == 1 and s.shape[1] == n:
        v = s[0]
    else:
        raise ValueError(f"{name} must have shape ({n},), ({n}, 1) or be a scalar, got {tuple(s.shape)}")
    return v.float() if v.dtype != torch.float32 else v


def _is_i8_matrix(t: Any) -> bool:
    return type(t) is torch.Tensor and t.dtype == torch.int8 and t.dim() == 2


def int8_gemm_dequant_fwd(
    A_q: torch.Tensor,
    B_q: torch.Tensor,
    sa: torch.Tensor | float | None,
    sb: torch.Tensor | float | None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.float16,
) -> torch.Tensor:
    """``(A_q @ B_q) * sa[:, None] * sb[None, :] (+ bias)`` with the int32 accumulator kept on chip.

    A_q: (M, K) int8, B_q: (K, N) int8, any strides (fast: ``B_q = W_q.t()`` of an (N, K) weight).
    sa: (M,), (M, 1) or scalar; sb: (N,), (1, N), (N, 1) or scalar; bias: (N,).
    out_dtype: float16 / bfloat16 / float32, or int32 for the raw product (scales and bias None).
    """
    if not (_is_i8_matrix(A_q) and _is_i8_matrix(B_q)):  # the full checks only to word the error
        check_tensor("A_q", A_q, dtypes=(torch.int8,), rank=2)
        check_tensor("B_q", B_q, dtypes=(torch.int8,), rank=2)
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    M, K = A_q.shape
    if B_q.shape[0] != K:
        raise ValueError(f"B_q must have shape (K={K}, N) to match A_q {tuple(A_q.shape)}, got {tuple(B_q.shape)}")
    N = B_q.shape[1]
    device = A_q.device
    if B_q.device != device or (bias is not None and bias.device != device):
        check_same_device(A_q=A_q, B_q=B_q, bias=bias)
    if out_dtype == torch.int32:
        if sa is not None or sb is not None or bias is not None:
            raise ValueError("out_dtype=torch.int32 returns the raw product: sa, sb and bias must be None")
        sa_v = sb_v = None
    else:
        if sa is None or sb is None:
            raise ValueError("sa and sb are required unless out_dtype=torch.int32")
        sa_v = _norm_scale("sa", sa, M, device)
        sb_v = _norm_scale("sb", sb, N, device)
    if bias is not None:
        check_tensor("bias", bias, dtypes=(torch.float16, torch.bfloat16, torch.float32), rank=1)
        if bias.shape[0] != N:
            raise ValueError(f"bias must have shape ({N},), got {tuple(bias.shape)}")
        if bias.stride(0) != 1:
            bias = bias.contiguous()
    if use_registered_op(A_q):
        select_backend(device)  # raises for unsupported devices
        return _gemm_dequant_op(A_q, B_q, sa_v, sb_v, bias, out_dtype)
    return _gemm_dequant_impl(A_q, B_q, sa_v, sb_v, bias, out_dtype)
