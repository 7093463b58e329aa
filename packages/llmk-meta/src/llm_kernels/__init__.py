"""llm_kernels: every llm-kernel-lib kernel behind one import, plus transformer modules, HF integration and a CLI.

The kernels live in their own packages (``flashattn_triton``, ``int8_gemm``, ``fused_rmsnorm``);
this package re-exports their public API unchanged and adds composed modules
(:mod:`llm_kernels.modules`), :func:`patch_model` for ``transformers`` Llama-family models
(:mod:`llm_kernels.hf`) and the ``llmk`` command line (:mod:`llm_kernels.cli`).
"""

from __future__ import annotations

from flashattn_triton import FlashAttention, flash_attn_forward, flash_attn_varlen_forward
from fused_rmsnorm import FusedRMSNormLinear, FusedRMSNormMultiLinear, fused_rmsnorm_linear
from int8_gemm import Int8Linear, int8_gemm_dequant_fwd, int8_linear, quantize_symmetric

__version__ = "0.1.0"

from .hf import patch_model  # noqa: E402
from .info import backends, versions  # noqa: E402
from .modules import KVCache, LlamaAttentionBlock, LlamaDecoderBlock, LlamaMLPBlock, RotaryEmbedding  # noqa: E402

__all__ = [
    "FlashAttention",
    "FusedRMSNormLinear",
    "FusedRMSNormMultiLinear",
    "Int8Linear",
    "KVCache",
    "LlamaAttentionBlock",
    "LlamaDecoderBlock",
    "LlamaMLPBlock",
    "RotaryEmbedding",
    "__version__",
    "backends",
    "flash_attn_forward",
    "flash_attn_varlen_forward",
    "fused_rmsnorm_linear",
    "int8_gemm_dequant_fwd",
    "int8_linear",
    "patch_model",
    "quantize_symmetric",
    "versions",
]
