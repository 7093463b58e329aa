"""One op per module: quantize (per-row int8 quantizer), gemm (int8 GEMM + fused dequant), linear (both)."""
