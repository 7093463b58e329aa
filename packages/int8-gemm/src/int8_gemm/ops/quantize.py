"""Symmetric per-row int8 quantization: ``x -> (x_q int8, scale fp32)``.

scale = absmax(row) / 127, x_q = clamp(round_half_even(x / scale), -127, 127).

All-zero rows: absmax is clamped below at ``MIN_ABSMAX`` (1e-30, a normal fp32 number), so
their scale is 1e-30/127 > 0 and their codes are 0; never NaN/inf. Rows whose absmax is
below 1e-30 (only reachable from fp32 input) are quantized against 1e-30 instead.

One Triton pass over the input: a tile of rows is loaded once, reduced to its absmax in
registers and written out as int8. Rows longer than ``_MAX_ONE_PASS`` fall back to a
two-sweep loop (absmax sweep, then quantize sweep).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._common import Backend, cdiv, check_tensor, interpreter_enabled, select_backend, use_registered_op
from .._common import direct as _direct

try:  # programmatic dependent launch (SM90+)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    gdc_launch_dependents = gdc_wait = None

MIN_ABSMAX = 1e-30
_MAX_ONE_PASS = 16384  # longest row held in registers in one go (GPU)
_MAX_ONE_PASS_INTERP = 4096
_DECODE_ROWS = 16  # up to this many rows: the decode launch shape (one row per program)
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Round-half-even of q = fl32(x * fl32(127 / absmax)), the same on every path (the torch
# reference rounds the fp32 product too). Under the interpreter (numpy fp32): adding 1.5 * 2**23
# pushes |y| < 2**22 into a binade whose ulp is 1, so the add itself rounds to the nearest
# integer (ties to even) and subtracting it back is exact. On the GPU that trick is unsafe: the
# compiler contracts x * inv + magic into one FMA, which rounds the exact product instead of the
# fp32 one. For bf16 inputs many products land exactly on .5, and the FMA then rounds them by the
# sign of inv's rounding error instead of to even: 0.12% of the codes differed from a float64
# reference on the H200 (bf16, 16x4096), where an fp32 emulation of the uncontracted product gives
# 0.01-0.06% (the launch shape decided whether the compiler contracted). So the GPU rounds with
# cvt.rni, which takes the product as a value.
_RNE_MAGIC = 12582912.0

if interpreter_enabled():  # decided at import, as triton.jit itself does

    @triton.jit
    def _rne(y):
        return (y + 12582912.0) - 12582912.0

else:

    @triton.jit
    def _rne(y):
        return tl.inline_asm_elementwise("cvt.rni.f32.f32 $0, $1;", "=r,r", [y], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _quantize_rows_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    R,
    K,
    stride_xr,
    stride_xk,
    stride_qr,
    MIN_AMAX: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ONE_PASS: tl.constexpr,
    X_K_CONTIG: tl.constexpr,
    PDL_TRIGGER: tl.constexpr = False,
    PDL_WAIT: tl.constexpr = False,
):
    if PDL_TRIGGER:
        # Let the GEMM that follows (launched as a programmatic dependent) start now: it sets up
        # and then waits for this grid to finish (griddepcontrol.wait) before it reads x_q.
        gdc_launch_dependents()
    if PDL_WAIT:
        # This launch is itself a programmatic dependent of the previous kernel, which may be the one
        # writing x: nothing is read or written before that grid is done.
        gdc_wait()
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    cols = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rows[:, None] * stride_xr
    q_rows = q_ptr + rows[:, None] * stride_qr
    if X_K_CONTIG:
        x_cols = cols[None, :]
    else:
        x_cols = cols[None, :].to(tl.int64) * stride_xk
    if ONE_PASS:
        m = rmask[:, None] & (cols[None, :] < K)
        x = tl.load(x_rows + x_cols, mask=m, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(x), axis=1), MIN_AMAX)
        inv = 127.0 / amax
        q = _rne(x * inv[:, None])
        q = tl.minimum(tl.maximum(q, -127.0), 127.0)
        tl.store(q_rows + cols[None, :], q.to(tl.int8), mask=m)
    else:
        amax = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            m = rmask[:, None] & (cols[None, :] + k0 < K)
            if X_K_CONTIG:
                off = x_cols + k0
            else:
                off = x_cols + k0 * stride_xk
            x = tl.load(x_rows + off, mask=m, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
        amax = tl.maximum(amax, MIN_AMAX)
        inv = 127.0 / amax
        for k0 in range(0, K, BLOCK_K):
            m = rmask[:, None] & (cols[None, :] + k0 < K)
            if X_K_CONTIG:
                off = x_cols + k0
            else:
                off = x_cols + k0 * stride_xk
            x = tl.load(x_rows + off, mask=m, other=0.0).to(tl.float32)
            q = _rne(x * inv[:, None])
            q = tl.minimum(tl.maximum(q, -127.0), 127.0)
            tl.store(q_rows + cols[None, :] + k0, q.to(tl.int8), mask=m)
    tl.store(s_ptr + rows, amax / 127.0, mask=rmask)


def _quantize_rows_torch(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference path (CPU without the interpreter): same math, torch ops."""
    xf = x2.float()
    amax = xf.abs().amax(dim=1).clamp_min(MIN_ABSMAX)
    inv = 127.0 / amax
    q = torch.round(xf * inv[:, None]).clamp_(-127, 127).to(torch.int8)  # torch.round is half-even
    return q, amax / 127.0


_QPLANS: dict[tuple, tuple] = {}


def _quantize_plan(
    R: int, K: int, x_k_contig: bool, interp: bool, max_one_pass: int | None, pdl: bool, pdl_wait: bool = False
) -> tuple:
    cap = max_one_pass or (_MAX_ONE_PASS_INTERP if interp else _MAX_ONE_PASS)
    one_pass = K <= cap
    block_k = triton.next_power_of_2(K) if one_pass else min(cap, 4096)
    # Several short rows per program keep each program's tile around 2-8K elements.
    target = 8192 if not interp else 16384
    block_r = max(1, min(triton.next_power_of_2(R), target // block_k)) if one_pass else 1
    if interp:
        num_warps = 4
    elif one_pass and R <= _DECODE_ROWS:
        # a decode batch: one row per program, ~32 elements a thread. The quantizer is on Int8Linear's critical
        # path there (the GEMM waits for it); on the H200 (scripts/probe_int8_quant.py, 2026-12-01) this took
        # it from 1.94 to 1.59 us at M=16 K=4096 (packed: 8 programs of 2 rows, 8 warps), e2e 9.70 -> 9.50 us
        # at N=4096 and 19.23 -> 18.79 us at N=14336; at K=14336 it is the old launch (1 row, 16 warps).
        block_r = 1
        num_warps = max(4, min(16, block_k // 1024))
    else:
        num_warps = 4 if block_r * block_k <= 2048 else (8 if block_r * block_k <= 8192 else 16)
    kw = dict(
        MIN_AMAX=MIN_ABSMAX,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        ONE_PASS=one_pass,
        X_K_CONTIG=x_k_contig,
        num_warps=num_warps,
    )
    if pdl and not interp:
        kw["PDL_TRIGGER"] = True
    if pdl_wait and not interp and gdc_wait is not None:
        kw.update(PDL_WAIT=True, launch_pdl=True)
    return ((cdiv(R, block_r),), kw)


def _launch_quantize_rows(
    x2: torch.Tensor, max_one_pass: int | None = None, pdl: bool = False, pdl_wait: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """pdl: the next kernel is launched as a programmatic dependent (see int8_linear). pdl_wait: this
    one is too, of the kernel before it (it waits for that grid before touching memory)."""
    R, K = x2.shape
    q = torch.empty((R, K), dtype=torch.int8, device=x2.device)
    s = torch.empty((R,), dtype=torch.float32, device=x2.device)
    if R == 0:
        return q, s
    interp = x2.device.type != "cuda"
    # the strides are in the key: Triton specializes integer arguments (== 1, multiple of 16)
    key = (R, K, x2.stride(0), x2.stride(1), x2.dtype, x2.device, interp, max_one_pass, pdl, pdl_wait)
    plan = _QPLANS.get(key)
    if plan is None:
        if len(_QPLANS) > 4096:
            _QPLANS.clear()
        plan = _quantize_plan(R, K, x2.stride(1) == 1, interp, max_one_pass, pdl, pdl_wait)
        plan = _QPLANS[key] = plan + (_direct.Direct(),)
    grid, kw, dl = plan
    args = (x2, q, s, R, K, x2.stride(0), x2.stride(1), q.stride(0))
    _direct.launch(dl, _quantize_rows_kernel, grid, args, kw, (x2.data_ptr() % 16,))
    return q, s


def _quantize_rows_impl(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if select_backend(x2.device) is Backend.TORCH:
        return _quantize_rows_torch(x2)
    return _launch_quantize_rows(x2)


_quantize_rows_op = torch.library.custom_op("int8_gemm::quantize_rows", _quantize_rows_impl, mutates_args=())


@_quantize_rows_op.register_fake
def _(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    R, K = x2.shape
    return x2.new_empty((R, K), dtype=torch.int8), x2.new_empty((R,), dtype=torch.float32)


def _as_rows(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, list[int]]:
    """Move ``dim`` last and view as (rows, K) without copying when the strides allow."""
    xm = x.movedim(dim, -1)
    moved_shape = list(xm.shape)
    K = moved_shape[-1]
    x2 = xm.reshape(-1, K)  # a view whenever possible; kernel takes any 2-D strides
    return x2, moved_shape


def quantize_symmetric(x: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 quantization along ``dim``.

    Returns ``(x_q, scale)``: ``x_q`` int8 with ``x``'s shape (contiguous), ``scale`` fp32 with
    ``x``'s shape except ``dim`` has size 1 (keepdim), so ``x_q * scale`` dequantizes.
    ``x ~= x_q * scale`` with ``|x - x_q * scale| <= scale / 2`` per element.
    """
    check_tensor("x", x, dtypes=_FLOAT_DTYPES, min_rank=1)
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be an int in [{-x.dim()}, {x.dim() - 1}], got {dim!r}")
    dim = dim % x.dim()
    if x.shape[dim] == 0:
        raise ValueError(f"x must have a non-empty dim {dim}, got shape {tuple(x.shape)}")
    x2, moved_shape = _as_rows(x, dim)
    q2, s = (_quantize_rows_op if use_registered_op(x2) else _quantize_rows_impl)(x2)
    q = q2.view(moved_shape).movedim(-1, dim)
    if dim != x.dim() - 1:
        q = q.contiguous()
    scale_shape = list(x.shape)
    scale_shape[dim] = 1
    return q, s.view(scale_shape)
