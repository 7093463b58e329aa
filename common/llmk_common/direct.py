"""Direct launch of an already compiled Triton kernel, once per launch plan.

``kernel[grid](*args, **kw)`` goes through ``JITFunction.run`` on every call: it binds the
arguments, specializes each one (dtype, 16-byte alignment, integer divisibility), builds a string
cache key and looks the compiled kernel up, which is a large part of the ~30 us host cost of one
launch. Our launch plans already pin everything that specialization depends on except pointer
alignment and the bias dtype, so after the first (normal) launch of a plan we keep the
``CompiledKernel`` it returned and call its launcher directly with the same argument layout
(``CompiledKernel.run(gx, gy, gz, stream, function, packed_metadata, launch_metadata, enter_hook,
exit_hook, *all_params)``, identical in Triton 3.6 to 3.9).

Safety: the direct path is only used on CUDA (never under ``TRITON_INTERPRET``), only when the
caller's alignment key and the current device match those of the captured launch and no launch
hooks (profilers) are registered; otherwise, and permanently for the plan if the first direct
launch raises, the normal ``kernel[grid]`` path runs. ``LLMK_DIRECT_LAUNCH=0`` turns it off for every package
(``INT8_GEMM_DIRECT_LAUNCH=0``, the older name, still does).

Shared by int8-gemm (its GEMM and quantizer plans) and flashattn-triton (the SM90 Gluon forward, whose
host-side tensor descriptors ride in the argument list as duck-typed objects, see ``Desc``).
"""

from __future__ import annotations

import inspect
import os

import torch

try:
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover  (Triton < 3.4: direct launch off)
    _knobs = None

ENABLED = (
    os.environ.get("LLMK_DIRECT_LAUNCH", "1") not in ("0", "")
    and os.environ.get("INT8_GEMM_DIRECT_LAUNCH", "1") not in ("0", "")
    and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    and _knobs is not None
)

_UNSET, _CAPTURED, _PROVEN, _OFF = 0, 1, 2, -1
_TAILS: dict[tuple, tuple | None] = {}


class Direct:
    """Direct-launch state of one launch plan (one kernel, one grid, fixed constexprs)."""

    __slots__ = ("state", "run", "function", "md", "tail", "grid", "device", "align", "error")

    def __init__(self) -> None:
        self.state = _UNSET
        self.error = None


def _tail(fn, n_pos: int, kw: dict) -> tuple | None:
    """Values of the parameters after the n_pos positional ones, in signature order (keyword or
    default), i.e. what JITFunction.run's binder appends; None if one is missing."""
    try:
        params = list(inspect.signature(fn.fn).parameters.values())
    except (AttributeError, TypeError, ValueError):
        return None
    out = []
    for p in params[n_pos:]:
        if p.name in kw:
            out.append(kw[p.name])
        elif p.default is not inspect.Parameter.empty:
            out.append(p.default)
        else:
            return None
    return tuple(out)


def launch(d: Direct, fn, grid: tuple, args: tuple, kw: dict, align: tuple, normal_args=None) -> None:
    """Launch ``fn[grid](*args, **kw)``; directly when ``d`` holds a captured kernel that fits.
    ``align``: the specialization-relevant facts the plan key does not pin (pointer alignment,
    bias dtype), compared with the captured launch's on every call. ``normal_args``: a callable
    giving the arguments for the normal path when ``args`` only suit the launcher (``Desc``)."""
    st = d.state
    if st > 0 and ENABLED and align == d.align:
        dev = torch._C._cuda_getDevice()
        rt = _knobs.runtime
        enter, exit_ = rt.launch_enter_hook, rt.launch_exit_hook
        if dev == d.device and not getattr(enter, "calls", True) and not getattr(exit_, "calls", True):
            stream = torch._C._cuda_getCurrentRawStream(dev)
            g0, g1, g2 = d.grid
            if st == _PROVEN:
                d.run(g0, g1, g2, stream, d.function, d.md, None, enter, exit_, *args, *d.tail)
                return
            try:
                d.run(g0, g1, g2, stream, d.function, d.md, None, enter, exit_, *args, *d.tail)
            except Exception as e:  # noqa: BLE001  first direct launch failed: normal path for good
                d.state = _OFF
                d.error = f"{type(e).__name__}: {e}"
            else:
                d.state = _PROVEN
                return
    k = fn[grid](*(args if normal_args is None else normal_args()), **kw)
    if st == _UNSET and ENABLED:
        _capture(d, fn, k, grid, args, kw, align)


def _capture(d: Direct, fn, k, grid, args, kw, align) -> None:
    d.state = _OFF
    try:
        if not torch.cuda.is_available() or k is None:
            return
        run, function, md = k.run, k.function, k.packed_metadata
        if not callable(run) or function is None:
            return
        key = (id(fn), len(args), tuple(sorted(kw.items())))
        if key not in _TAILS:
            _TAILS[key] = _tail(fn, len(args), kw)
        tail = _TAILS[key]
        if tail is None:
            return
        g = tuple(grid) + (1,) * (3 - len(grid))
        d.run, d.function, d.md, d.tail, d.grid = run, function, md, tail, g
        d.device = torch.cuda.current_device()
        d.align = align
        d.state = _CAPTURED
    except Exception as e:  # noqa: BLE001  any surprise in Triton's internals: stay on the normal path
        d.state = _OFF
        d.error = f"{type(e).__name__}: {e}"


class Desc:
    """The fields Triton's launcher reads from a host ``TensorDescriptor`` (``base``, ``shape``,
    ``strides``, ``padding``) to encode the TMA descriptor: direct launches pass this instead of
    building and validating a TensorDescriptor per call (block shape and layout are compiled in)."""

    __slots__ = ("base", "shape", "strides", "padding")

    def __init__(self, base: torch.Tensor, shape, strides, padding: str = "zero") -> None:
        self.base, self.shape, self.strides, self.padding = base, shape, strides, padding


def al(t: torch.Tensor) -> bool:
    """Triton's pointer specialization: is the base 16-byte aligned."""
    return t.data_ptr() % 16 == 0
