"""Helpers shared by every llm-kernel-lib package.

This directory is the single source of truth. Each package links it into its own
namespace as ``<package>/_common`` (a symlink in the repo, a real copy inside the
sdist and wheel), so every wheel installs and imports alone and the packages never
import each other.
"""

from .checks import check_same_device, check_tensor
from .device import Backend, interpreter_enabled, num_sms, select_backend, use_registered_op
from .shapes import cdiv
from .tuning import TuningTable, arch_key, capability

__all__ = [
    "Backend",
    "TuningTable",
    "arch_key",
    "capability",
    "cdiv",
    "check_same_device",
    "check_tensor",
    "interpreter_enabled",
    "num_sms",
    "select_backend",
    "use_registered_op",
]
