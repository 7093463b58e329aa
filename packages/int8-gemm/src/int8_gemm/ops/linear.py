"""``int8_linear``: dynamic per-token activation quantization + int8 GEMM with fused dequant.

No extra pass over the output: the quantize kernel reads x once and writes x_q (int8) +
per-token scales; the GEMM reads x_q and the K-major weight and writes the dequantized (+bias)
output directly from its int32 accumulator. Optionally (FUSED_QUANT_MAX_BYTES, off by default)
small x skips the quantize kernel: the GEMM quantizes its A tiles itself, with the same math.
"""

from __future__ import annotations

import torch

from .._common import Backend, check_same_device, check_tensor, select_backend, use_registered_op
from .gemm import _gemm_dequant_impl, _launch, _norm_scale
from .quantize import _quantize_rows_impl

_ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# Activations of up to this many bytes (M * K * itemsize) are quantized inside the GEMM: one
# launch instead of two, but every GEMM program then re-reads its rows for the absmax before
# its main loop. Off by default: on the H200 (2026-11-29, CUDA-graph timed) the two-kernel path
# was faster at every decode shape measured (M=1: 10.6 vs 13.9 us at 4096x4096, 22.1 vs 42.8 us
# at N=4096 K=14336; M=16 likewise), so the single launch does not pay for the serial absmax.
FUSED_QUANT_MAX_BYTES = 0


def _use_fused_quant(x2: torch.Tensor) -> bool:
    return x2.shape[0] * x2.shape[1] * x2.element_size() <= FUSED_QUANT_MAX_BYTES


def _int8_linear_impl(
    x2: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    # w_q is (N, K) contiguous: w_q.t() is the K-major B the GEMM is fastest with.
    if _use_fused_quant(x2) and select_backend(x2.device) is not Backend.TORCH:
        return _launch(x2, w_q.t(), None, w_scale, bias, out_dtype, quant_a=True)
    x_q, sa = _quantize_rows_impl(x2)
    return _gemm_dequant_impl(x_q, w_q.t(), sa, w_scale, bias, out_dtype)


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
    check_tensor("x", x, dtypes=_ACT_DTYPES, min_rank=1)
    check_tensor("w_q", w_q, dtypes=(torch.int8,), rank=2)
    N, K = w_q.shape
    if x.shape[-1] != K:
        raise ValueError(f"x must have last dim K={K} to match w_q {tuple(w_q.shape)}, got {tuple(x.shape)}")
    device = check_same_device(x=x, w_q=w_q, w_scale=w_scale, bias=bias)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if out_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"out_dtype must be float16, bfloat16 or float32, got {out_dtype}")
    sb = _norm_scale("w_scale", w_scale, N, device)
    if bias is not None:
        check_tensor("bias", bias, dtypes=_ACT_DTYPES, rank=1)
        if bias.shape[0] != N:
            raise ValueError(f"bias must have shape ({N},), got {tuple(bias.shape)}")
        bias = bias.contiguous()
    if w_q.stride(1) != 1:
        w_q = w_q.contiguous()
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    y = (_int8_linear_op if use_registered_op(x2) else _int8_linear_impl)(x2, w_q, sb, bias, out_dtype)
    return y.view(*lead, N)
