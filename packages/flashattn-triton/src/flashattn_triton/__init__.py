"""FlashAttention-2-style attention (forward, backward, split-KV decode, varlen) written in Triton."""

__version__ = "0.1.0"

from .modules import FlashAttention
from .ops.flash_attn import flash_attn_forward
from .ops.flash_attn_varlen import flash_attn_varlen_forward

__all__ = ["FlashAttention", "__version__", "flash_attn_forward", "flash_attn_varlen_forward"]
