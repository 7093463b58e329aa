"""fused_rmsnorm: fused RMSNorm + Linear as a CUDA C++ (pybind11) extension, torch-version independent."""

__version__ = "0.1.0"

from .backend import backend_info
from .modules import FusedRMSNormLinear, FusedRMSNormMultiLinear
from .ops.rmsnorm_linear import fold_weight, fused_rmsnorm_linear

__all__ = [
    "FusedRMSNormLinear",
    "FusedRMSNormMultiLinear",
    "__version__",
    "backend_info",
    "fold_weight",
    "fused_rmsnorm_linear",
]
