"""``int8_linear``: dynamic per-token activation quantization + int8 GEMM with fused dequant.

No extra pass over the output: the quantize kernel reads x once and writes x_q (int8) +
per-token scales; the GEMM reads x_q and the K-major weight and writes the dequantized (+bias)
output directly from its int32 accumulator. Optionally (FUSED_QUANT_MAX_BYTES, off by default)
small x skips the quantize kernel: the GEMM quantizes its A tiles itself, with the same math.
Decode shapes whose tuning entry says ``"GEMV": 1, "FUSED_QUANT": 1`` do the same in the GEMV
kernel (one launch, bit-identical to the two-kernel path).
"""

from __future__ import annotations

import torch

from .._common import Backend, check_same_device, check_tensor, select_backend, use_registered_op
from . import gemm as _gemm
from .gemm import _GEMV_MAX_M, _arch, _gemm_dequant_impl, _launch, _norm_scale, _sm_at_least
from .quantize import _launch_quantize_rows, _quantize_rows_impl

_ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# Activations of up to this many bytes (M * K * itemsize) are quantized inside the GEMM: one
# launch instead of two, but every GEMM program then re-reads its rows for the absmax before
# its main loop. Off by default: on the H200 (2026-11-29, CUDA-graph timed) the two-kernel path
# was faster at every decode shape measured (M=1: 10.6 vs 13.9 us at 4096x4096, 22.1 vs 42.8 us
# at N=4096 K=14336; M=16 likewise), so the single launch did not pay for the serial absmax.
# Since then the M=1 absmax is one unrolled burst of loads and the weight slab can be prefetched
# into L2 first ("PREFETCH" in the config): scripts/probe_int8.py re-measures the switch point.
FUSED_QUANT_MAX_BYTES = 0

# Two-kernel path with the GEMM launched as a programmatic dependent launch (PDL) of the quantizer
# (SM90+): its launch and setup overlap the quantizer; it waits (griddepcontrol.wait) before it
# touches x_q or writes anything. Per shape: a tuning entry with "PDL": 1 (tensor-core, swap-AB or
# GEMV config), set where the H200 probes (scripts/probe_int8_pdl.py, probe_int8_swapab.py) measured
# a gain, e.g. M=16 4096x4096 10.23 vs 10.82 us, M=1 N=4096 K=14336 GEMV 19.31 vs 20.07 us. The L2
# weight prefetch ("PREFETCH": 1) made every PDL case slower (+1.4 to +4.8 us). So did a bulk
# variant tried on the swap-AB kernel (one cp.async.bulk.prefetch.L2 per weight row before the
# wait; benchmarks/results/probes/h200-probe_int8_swapab_pf.json): M=16 4096x4096 11.8 vs 9.7 us,
# N=14336 22.9 vs 19.0 us. It was not kept. Session 7 tried the same idea with real loads: a Gluon form of
# the swap-AB kernel that TMA-loads its first weight stages into shared memory before the wait (16/16 GPU
# tests passed). Every PDL case got slower than its own two-kernel launch once more than ~64 KB of weight per
# CTA went out before the wait (M=16 4096x4096: 11.9 vs 11.1 us; shipped path 9.8 us), and the kernel alone
# was 4-10% slower than the Triton one (benchmarks/results/probes/h200-probe_int8_swapab_gluon.json, the code
# in the .patch beside it): the early weight stream seems to delay the quantizer rather than hide it.
# PDL_MAX_M forces PDL for every M <= it (probes, tests).
PDL_MAX_M = 0

# PDL across calls (SM90+, the "PDL": 1 decode entries above): the quantizer is itself launched as a
# programmatic dependent of whatever kernel precedes it on the stream and waits for that grid before it
# reads x, and the GEMM lets the next call's quantizer launch early (ops/gemm.py _PDL_TRIGGER_DOC): 0 =
# off, 1 = the GEMM triggers after its main loop, 2 = at its start. Either way no kernel reads or writes
# memory before the grid before it is done, so only launch latency and setup overlap. H200, session 19
# (scripts/probe_int8_pdl_chain.py, benchmarks/results/probes/h200-probe_int8_pdl_chain.json; CUDA graph,
# W rotated): with calls back to back 1 was faster than 0 at all 7 two-kernel decode shapes, e.g. M=16
# 4096x4096 8.69 -> 7.90 us, M=8 8.68 -> 7.73, M=16 N=14336 19.04 -> 18.49; after an unrelated (non-PDL)
# elementwise kernel by 0.1-0.2 us. 2 was up to 4.7 us slower than 1 where the next grid does not fit
# beside the running one (M=16 N=14336: 23.2 us). The one-launch fused-quant GEMV (M=1) stays an ordinary
# launch: as a PDL launch it gained 0.2-0.6 us back to back but lost 0.6 us after the elementwise kernel.
PDL_CHAIN = 1


def _decode_cfg(x2: torch.Tensor, N: int) -> dict | None:
    """The GEMM's tuning entry for a decode-sized x (M <= 16), else None (no per-shape options)."""
    M, K = x2.shape
    if M > _GEMV_MAX_M:
        return None
    return _gemm._config_for(M, N, K, x2.device, True)  # via the module: replaceable (tests, tools)


def _use_fused_quant(x2: torch.Tensor, cfg: dict | None = None) -> bool:
    """Fused quantization: small x (FUSED_QUANT_MAX_BYTES), or a tuning entry for this shape with
    "GEMV": 1 and "FUSED_QUANT": 1 (decode as ONE launch: the GEMV quantizes x itself)."""
    M, K = x2.shape
    if M * K * x2.element_size() <= FUSED_QUANT_MAX_BYTES:
        return True
    return bool(cfg and cfg.get("GEMV", 0) and cfg.get("FUSED_QUANT", 0))


def _use_pdl(x2: torch.Tensor, cfg: dict | None = None) -> bool:
    if x2.device.type != "cuda":
        return False
    if x2.shape[0] > PDL_MAX_M and not (cfg and cfg.get("PDL", 0)):
        return False
    return _sm_at_least(_arch(x2.device), 90)


def _int8_linear_impl(
    x2: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    # w_q is (N, K) contiguous: w_q.t() is the K-major B the GEMM is fastest with.
    backend = select_backend(x2.device)
    if backend is Backend.TORCH:
        x_q, sa = _quantize_rows_impl(x2)
        return _gemm_dequant_impl(x_q, w_q.t(), sa, w_scale, bias, out_dtype)
    cfg = _decode_cfg(x2, w_q.shape[0])
    if _use_fused_quant(x2, cfg):
        return _launch(x2, w_q.t(), None, w_scale, bias, out_dtype, quant_a=True)
    pdl = _use_pdl(x2, cfg)
    chain = PDL_CHAIN if pdl and cfg is not None else 0
    x_q, sa = _launch_quantize_rows(x2, pdl=pdl, pdl_wait=bool(chain))
    return _launch(x_q, w_q.t(), sa, w_scale, bias, out_dtype, pdl=1 + chain if pdl else 0)


_int8_linear_op = torch.library.custom_op("int8_gemm::int8_linear", _int8_linear_impl, mutates_args=())


@_int8_linear_op.register_fake
def _(x2, w_q, w_scale, bias, out_dtype):
    return x2.new_empty((x2.shape[0], w_q.shape[0]), dtype=out_dtype)


def int8_linear(
    x: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``y = x @ (w_q * w_scale[:, None]).T + bias`` with x quantized per token on the fly.

    x: (..., K) fp16/bf16/fp32; w_q: (N, K) int8 (an nn.Linear weight layout, K-major);
    w_scale: (N,) or (N, 1) fp32 per-output-channel scales; bias: (N,) or None.
    Returns (..., N) in ``out_dtype`` (default: x.dtype).
    """
    # Cheap checks first (this runs every decode step); the full ones only to word an error.
    if not (type(x) is torch.Tensor and x.dtype in _ACT_DTYPES and x.dim() >= 1):
        check_tensor("x", x, dtypes=_ACT_DTYPES, min_rank=1)
    if not (type(w_q) is torch.Tensor and w_q.dtype == torch.int8 and w_q.dim() == 2):
        check_tensor("w_q", w_q, dtypes=(torch.int8,), rank=2)
    N, K = w_q.shape
    if x.shape[-1] != K:
        raise ValueError(f"x must have last dim K={K} to match w_q {tuple(w_q.shape)}, got {tuple(x.shape)}")
    device = x.device
    if w_q.device != device or (bias is not None and bias.device != device):
        check_same_device(x=x, w_q=w_q, w_scale=w_scale, bias=bias)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if out_dtype not in _ACT_DTYPES:
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    sb = _norm_scale("w_scale", w_scale, N, device)
    if bias is not None:
        if not (type(bias) is torch.Tensor and bias.dtype in _ACT_DTYPES and bias.dim() == 1):
            check_tensor("bias", bias, dtypes=_ACT_DTYPES, rank=1)
        if bias.shape[0] != N:
            raise ValueError(f"bias must have shape ({N},), got {tuple(bias.shape)}")
        if bias.stride(0) != 1:
            bias = bias.contiguous()
    if w_q.stride(1) != 1:
        w_q = w_q.contiguous()
    x2 = x if x.dim() == 2 else x.reshape(-1, K)
    if use_registered_op(x2):
        y = _int8_linear_op(x2, w_q, sb, bias, out_dtype)
    else:
        y = _int8_linear_impl(x2, w_q, sb, bias, out_dtype)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], N)
