"""What is installed and which implementation each op will use, and why (``llmk info``)."""

from __future__ import annotations

import os
import platform
from typing import Any

import flashattn_triton
import fused_rmsnorm
import int8_gemm
import torch
from flashattn_triton._common import Backend, interpreter_enabled, select_backend

from . import __version__


def versions() -> dict[str, str | None]:
    """Versions of llm_kernels, the three kernel packages, torch, triton and the CUDA runtime torch was built for."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # pragma: no cover - triton missing entirely
        triton_version = None
    return {
        "llm_kernels": __version__,
        "flashattn_triton": flashattn_triton.__version__,
        "int8_gemm": int8_gemm.__version__,
        "fused_rmsnorm": fused_rmsnorm.__version__,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
    }


def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def gpu_info() -> dict[str, Any] | None:
    if not torch.cuda.is_available():
        return None
    i = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(i)
    return {
        "index": i,
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "arch": f"sm{p.major}{p.minor}",
        "sm_count": p.multi_processor_count,
        "memory_gib": round(p.total_memory / 2**30, 1),
    }


def _triton_backend(device: torch.device) -> dict[str, Any]:
    """The shared device rule (``select_backend``) for a Triton op, in words."""
    backend = select_backend(device)
    if backend == Backend.GPU:
        return {"backend": "triton", "why": f"CUDA tensors ({device}): the compiled Triton kernel"}
    if backend == Backend.INTERPRETER:
        return {
            "backend": "interpreter",
            "why": "CPU tensors with TRITON_INTERPRET=1: the same Triton kernel under Triton's interpreter (slow)",
        }
    return {"backend": "torch", "why": "CPU tensors, TRITON_INTERPRET unset: the PyTorch reference path"}


def _rmsnorm_backend(device: torch.device, resolve: bool) -> dict[str, Any]:
    """fused_rmsnorm is a CUDA C++ extension: AOT-built, JIT-compiled at first use, or the PyTorch path."""
    try:
        pkg = fused_rmsnorm.backend_info(resolve=resolve) if device.type == "cuda" else fused_rmsnorm.backend_info()
    except Exception as e:  # informational: never let `llmk info` die on it
        pkg = {"error": f"{type(e).__name__}: {e}"}
    if select_backend(device, has_interpreter=False) != Backend.GPU:
        out = {"backend": "torch", "why": "CPU tensors: the CUDA extension has no CPU/interpreter kernel, PyTorch path"}
    elif pkg.get("prefill") == "unresolved" or "prefill" not in pkg:
        aot = pkg.get("aot", {})
        have = (
            f"AOT extension present (archs {', '.join(aot.get('archs', []))})" if aot.get("present") else "no AOT build"
        )
        out = {
            "backend": "pending",
            "why": f"{have}; chosen at the first CUDA call (AOT -> JIT build -> torch). "
            "`llmk info --resolve` decides now (a JIT build can take minutes)",
        }
    else:
        out = {
            "backend": f"prefill={pkg['prefill']} decode={pkg['decode']}",
            "why": pkg.get("reason", ""),
        }
    out["package_info"] = pkg
    return out


def backends(device: torch.device | str | None = None, *, resolve: bool = False) -> dict[str, dict[str, Any]]:
    """Which implementation each public op uses for tensors on ``device`` (default: cuda if present, else cpu)."""
    device = default_device() if device is None else torch.device(device)
    attn = _triton_backend(device)
    int8 = _triton_backend(device)
    rms = _rmsnorm_backend(device, resolve)
    return {
        "flash_attn_forward": attn,
        "flash_attn_varlen_forward": attn,
        "quantize_symmetric": int8,
        "int8_gemm_dequant_fwd": int8,
        "int8_linear": int8,
        "fused_rmsnorm_linear": rms,
    }


def info(resolve: bool = False) -> dict[str, Any]:
    device = default_device()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpu": gpu_info(),
        "versions": versions(),
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"),
        "interpreter_enabled": interpreter_enabled(),
        "device": str(device),
        "backends": backends(device, resolve=resolve),
    }
