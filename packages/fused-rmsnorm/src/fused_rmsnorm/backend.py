"""Which implementation serves CUDA tensors: AOT extension -> JIT extension -> pure PyTorch.

* ``aot``: ``fused_rmsnorm._C`` built into the wheel (or by ``python -m fused_rmsnorm._build --inplace``),
  used when its compiled arch list covers the device; a warning names a binary built from other sources than
  the installed ``csrc/`` (an in-place build older than an edit, a copied binary).
* ``jit``: the same sources (shipped in ``fused_rmsnorm/csrc``) compiled with nvcc at first use
  for the current device into ``~/.cache/fused_rmsnorm/<key>/`` (key: sources, arch, CUDA
  version, Python ABI, CUTLASS location), under a file lock.
* ``torch``: F.rms_norm-equivalent + F.linear; correct, not fused; warns once.

``FUSED_RMSNORM_BACKEND`` = ``auto`` (default) | ``aot`` | ``jit`` | ``torch`` forces a choice
(``aot`` / ``jit`` raise instead of falling back). ``FUSED_RMSNORM_JIT=0`` disables the JIT step.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch


def _b():
    # imported lazily so `python -m fused_rmsnorm._build` does not find itself pre-imported
    from . import _build

    return _build


_LOCK = threading.Lock()
_CACHE: dict[tuple[int, int], Ext] = {}
_WARNED: set[str] = set()


@dataclass
class Ext:
    kind: str  # "aot" | "jit" | "torch"
    module: Any = None
    reason: str = ""
    archs: list[str] = field(default_factory=list)

    @property
    def has_gemm_sm90(self) -> bool:
        return self.module is not None and bool(self.module.has_sm90_gemm())

    @property
    def has_gemm_sm80(self) -> bool:
        return self.module is not None and bool(self.module.has_sm80_gemm())

    @property
    def has_decode_mma(self) -> bool:
        # getattr: a JIT cache or AOT module built before the tensor-core decode kernel existed
        return self.module is not None and bool(getattr(self.module, "has_decode_mma", lambda: False)())

    @property
    def has_stream_wgmma(self) -> bool:
        # the stream decode kernel's sm_90a (wgmma) twin is in the binary (session 30+ builds with 9.0a)
        return self.module is not None and bool(getattr(self.module, "has_stream_wgmma", lambda: False)())


def forced_backend() -> str:
    v = os.environ.get("FUSED_RMSNORM_BACKEND", "auto").strip().lower() or "auto"
    if v not in ("auto", "aot", "jit", "torch"):
        raise ValueError(f"FUSED_RMSNORM_BACKEND must be auto, aot, jit or torch, got {v!r}")
    return v


def jit_enabled() -> bool:
    return os.environ.get("FUSED_RMSNORM_JIT", "1").strip() not in ("0", "false", "no")


def device_arch(cap: tuple[int, int]) -> str:
    """The arch string to JIT-compile for a device: 9.0 gets 9.0a (the Hopper GEMM needs it)."""
    major, minor = cap
    return f"{major}.{minor}{'a' if (major, minor) == (9, 0) else ''}"


def covers(archs: list[str], cap: tuple[int, int]) -> bool:
    """True if a binary built for ``archs`` runs natively (cubin) or by PTX JIT on ``cap``."""
    major, minor = cap
    nums = []
    for a in archs:
        a = a.replace("+PTX", "")
        mj, mn = a.split(".")
        nums.append((int(mj), int(mn.rstrip("a"))))
    if any(mj == major and mn <= minor for mj, mn in nums):
        return True
    # decode/rstd carry PTX of the newest arch: newer majors can run them (GEMMs fall back to torch)
    return bool(nums) and max(nums) < cap and major > max(nums)[0]


def aot_staleness(mod: Any) -> str | None:
    """Why ``mod`` was not built from the installed sources, or None: it was, or that is unknown (a module built
    before it carried ``source_hash``, or an install without ``csrc/``)."""
    built = getattr(mod, "source_hash", lambda: "")()
    if not built or not _b().CSRC.is_dir():
        return None
    here = _b().source_hash()
    if built == here:
        return None
    return (
        f"the AOT extension was built from other sources than the installed csrc/ + _build.py (built {built[:12]}, "
        f"installed {here[:12]}): rebuild it (python -m fused_rmsnorm._build --inplace) or set "
        "FUSED_RMSNORM_BACKEND=jit to compile the installed sources"
    )


def _try_aot(cap: tuple[int, int]) -> Ext:
    try:
        mod = importlib.import_module("fused_rmsnorm._C")
    except ImportError as e:
        return Ext("torch", reason=f"no AOT extension ({e})")
    archs = list(mod.compiled_archs())
    if not covers(archs, cap):
        return Ext("torch", reason=f"AOT extension built for {';'.join(archs)} does not cover sm{cap[0]}{cap[1]}")
    stale = aot_staleness(mod)
    if stale is None:
        return Ext("aot", mod, "AOT extension in the installed package", archs)
    # still used: it runs, and a silent JIT build (minutes) or the unfused torch path would surprise more
    warn_once("stale-aot", f"fused_rmsnorm: {stale}; using it anyway")
    return Ext("aot", mod, f"AOT extension in the installed package, STALE: {stale}", archs)


def _try_jit(cap: tuple[int, int]) -> Ext:
    if not jit_enabled():
        return Ext("torch", reason="JIT disabled (FUSED_RMSNORM_JIT=0)")
    if _b().find_nvcc() is None:
        return Ext("torch", reason="JIT impossible: nvcc not found (set CUDA_HOME)")
    archs = [device_arch(cap)]
    try:
        path = _b().jit_build(archs)
        mod = _b().load_module(path)
    except Exception as e:  # compile errors, missing pybind11, ...
        return Ext("torch", reason=f"JIT build failed: {type(e).__name__}: {str(e)[:500]}")
    return Ext("jit", mod, f"JIT-compiled into {path.parent}", archs)


def get_ext(device: torch.device) -> Ext:
    """The extension serving ``device`` (resolved once per compute capability)."""
    cap = torch.cuda.get_device_capability(device)
    ext = _CACHE.get(cap)
    if ext is not None:
        return ext
    with _LOCK:
        ext = _CACHE.get(cap)
        if ext is not None:
            return ext
        mode = forced_backend()
        reasons = []
        ext = None
        if mode == "torch":
            ext = Ext("torch", reason="forced by FUSED_RMSNORM_BACKEND=torch")
        if ext is None and mode in ("auto", "aot"):
            cand = _try_aot(cap)
            if cand.kind == "aot":
                ext = cand
            else:
                reasons.append(cand.reason)
                if mode == "aot":
                    raise RuntimeError(f"FUSED_RMSNORM_BACKEND=aot but {cand.reason}")
        if ext is None and mode in ("auto", "jit"):
            cand = _try_jit(cap)
            if cand.kind == "jit":
                ext = cand
            else:
                reasons.append(cand.reason)
                if mode == "jit":
                    raise RuntimeError(f"FUSED_RMSNORM_BACKEND=jit but {cand.reason}")
        if ext is None:
            ext = Ext("torch", reason="; ".join(reasons))
        _CACHE[cap] = ext
    if ext.kind == "torch" and mode != "torch":
        warn_once(
            "torch-fallback",
            f"fused_rmsnorm: CUDA extension unavailable, using the (unfused) PyTorch path: {ext.reason}",
        )
    return ext


def warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def reset() -> None:
    """Forget resolved backends (tests switch FUSED_RMSNORM_BACKEND)."""
    with _LOCK:
        _CACHE.clear()
        _WARNED.clear()


def backend_info(resolve: bool = False) -> dict[str, Any]:
    """Which backend each path uses and why (for ``llmk info``).

    ``resolve=True`` resolves the CUDA backend now (may JIT-compile, minutes); the default only
    reports what is already known or cheaply discoverable.
    """
    info: dict[str, Any] = {
        "package": "fused_rmsnorm",
        "forced": forced_backend(),
        "jit_enabled": jit_enabled(),
        "nvcc": _b().find_nvcc(),
        "cutlass_headers": str(_b().cutlass_include() or "") or None,
        "cpu": "torch (PyTorch reference path: the extension has no CPU/interpreter kernel)",
    }
    try:
        mod = importlib.import_module("fused_rmsnorm._C")
        info["aot"] = {
            "present": True,
            "archs": list(mod.compiled_archs()),
            "sm90_gemm": bool(mod.has_sm90_gemm()),
            "sm80_gemm": bool(mod.has_sm80_gemm()),
            "stream_wgmma": bool(getattr(mod, "has_stream_wgmma", lambda: False)()),
            "cuda_version": int(mod.cuda_version()),
            "source_hash": getattr(mod, "source_hash", lambda: "")() or None,
            "stale": aot_staleness(mod) is not None,
        }
    except ImportError as e:
        info["aot"] = {"present": False, "reason": str(e)}
    if not torch.cuda.is_available():
        info.update(cuda=False, decode="torch", prefill="torch", reason="no CUDA device")
        return info
    dev = torch.device("cuda", torch.cuda.current_device())
    cap = torch.cuda.get_device_capability(dev)
    info["device"] = f"{torch.cuda.get_device_name(dev)} (sm{cap[0]}{cap[1]})"
    ext = get_ext(dev) if resolve else _CACHE.get(cap)
    if ext is None:
        # not resolved yet: say what the first call will do, without compiling anything
        aot = info["aot"]
        mode = info["forced"]
        if mode in ("auto", "aot") and aot.get("present") and covers(aot["archs"], cap):
            kind, why = "aot", "AOT extension covers this GPU (not loaded yet)"
        elif mode in ("auto", "jit") and jit_enabled() and info["nvcc"]:
            kind, why = "jit", "will be JIT-compiled at the first CUDA call (nvcc found)"
        else:
            kind, why = "torch", "no usable AOT extension and no JIT (nvcc missing or disabled)"
        info.update(cuda=True, decode=f"{kind} (pending)", prefill=f"{kind} (pending)", reason=why)
        return info
    gemm = None
    if ext.kind != "torch":
        if cap[0] == 9 and ext.has_gemm_sm90:
            gemm = "cutlass-sm90"
        elif cap[0] == 8 and ext.has_gemm_sm80:
            gemm = "cutlass-sm80"
    info.update(
        cuda=True,
        decode=ext.kind,
        prefill=f"{ext.kind}:{gemm}" if gemm else ("torch-gemm+ext-rstd" if ext.kind != "torch" else "torch"),
        reason=ext.reason,
        archs=ext.archs,
    )
    return info
