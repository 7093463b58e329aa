"""The device rule, implemented once for every op of every package.

* CUDA tensors -> the GPU kernel.
* CPU tensors  -> the same Triton kernel under Triton's interpreter when
  ``TRITON_INTERPRET=1`` is set (this is how CI exercises kernels on CPU),
  otherwise a PyTorch reference path.

Ops with no Triton kernel (the CUDA-extension op in ``fused_rmsnorm``) pass
``has_interpreter=False`` and use the PyTorch path for every CPU tensor.
"""

from __future__ import annotations

import enum
import functools
import os

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


class Backend(str, enum.Enum):
    GPU = "gpu"  # the compiled kernel on a CUDA device
    INTERPRETER = "interpreter"  # the Triton kernel run by Triton's CPU interpreter
    TORCH = "torch"  # the PyTorch reference implementation

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value


def interpreter_enabled() -> bool:
    """True when Triton's interpreter is switched on (read when ``triton.jit`` runs)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no")


def select_backend(device: torch.device, *, has_interpreter: bool = True) -> Backend:
    """Pick the implementation for tensors living on ``device``."""
    if device.type == "cuda":
        return Backend.GPU
    if device.type == "cpu":
        if has_interpreter and interpreter_enabled():
            return Backend.INTERPRETER
        return Backend.TORCH
    raise ValueError(f"unsupported device {device}: expected CUDA or CPU tensors")


def use_registered_op(*tensors: object) -> bool:
    """Should a public op go through its ``torch.library`` registration?

    Yes while torch.compile / export trace (the custom op is what keeps the graph whole) and
    for fake or meta tensors. Plain eager calls run the implementation directly: the
    dispatcher's Python-side cost per custom-op call (tens of microseconds) is the same order
    as a decode-sized kernel, and eager decode loops pay it on every token.
    """
    if torch.compiler.is_compiling():
        return True
    # A Python dispatch mode (make_fx / AOTAutograd tracing, FunctionalTensorMode, user modes such
    # as FlopCounterMode) must see the op itself, not the tensors our launcher allocates.
    if _get_current_dispatch_mode() is not None:
        return True
    for t in tensors:  # plain tensors (the eager case) are decided by a type check
        if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
            if t.is_meta:
                return True
        elif isinstance(t, torch.Tensor):
            from torch._subclasses.fake_tensor import FakeTensor

            if isinstance(t, FakeTensor) or t.is_meta:
                return True
    return False


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device | int | None = None, default: int = 4) -> int:
    """Streaming multiprocessors of a CUDA device (cached per device index); ``default`` for CPU
    tensors (the interpreter), so launch-shape heuristics stay deterministic there."""
    if isinstance(device, torch.device):
        if device.type != "cuda":
            return default
        device = device.index
    return _sm_count(torch.cuda.current_device() if device is None else int(device))
