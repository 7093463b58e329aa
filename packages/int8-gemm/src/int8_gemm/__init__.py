"""int8-gemm: W8A8 int8 GEMM with fused dequantization, quantizers and Int8Linear (Triton)."""

__version__ = "0.1.0"

from .modules import Int8Linear
from .ops.gemm import int8_gemm_dequant_fwd
from .ops.linear import int8_linear
from .ops.quantize import quantize_symmetric

__all__ = ["Int8Linear", "__version__", "int8_gemm_dequant_fwd", "int8_linear", "quantize_symmetric"]
