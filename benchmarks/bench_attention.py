"""flashattn-triton benchmarks: forward, backward and decode vs PyTorch SDPA, timed in the same run.

Suites (TFLOP/s with FLOPs = 4*B*H*Nq*Nk*D, x0.5 causal, x2.5 for the backward):
* attn-fwd: D in {64, 128} x N in {1k, 2k, 4k, 8k, 16k} x causal/non-causal, B*N = 16k, H*D = 2048,
  bf16. Ours vs SDPA default (cuDNN on H200; the anchor) and SDPA's FLASH backend (FA2).
* attn-bwd: D = 128, N in {1k, 4k, 16k}, causal/non-causal; the backward alone, timed by replaying
  ``torch.autograd.grad`` on a kept forward graph. Anchor: the FA2 backend; cuDNN also reported.
* attn-decode: Nq = 1, H = 32, Hkv = 8, D = 128, L in {1k, 8k, 32k}, B = 1 and B = 8, CUDA-graph
  timing (small=True); bytes = the K/V cache read once (TB/s = effective K/V bandwidth). Anchor:
  SDPA with enable_gqa=True (no K/V copy), and SDPA on pre-expanded K/V for reference.
Without a GPU: tiny shapes under the Triton interpreter (smoke pass, timings meaningless).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from .harness import Record, Suite, smoke_mode

try:
    import flashattn_triton as fa
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "flashattn-triton" / "src"))
    import flashattn_triton as fa


def _sdpa_backend(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, name)

    def wrap(fn):
        def call():
            with sdpa_kernel(backend):
                return fn()

        return call

    return wrap


def _fwd(suite: Suite, dims, sizes, dtype, device) -> None:
    for D in dims:
        for causal in (False, True):
            for N in sizes:
                tot = 16384 if not smoke_mode() else 128
                B, H = max(1, tot // N), max(1, (2048 if not smoke_mode() else 64) // D)
                q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype) for _ in range(3))
                impls = {
                    "flashattn-triton": lambda q=q, k=k, v=v, c=causal: fa.flash_attn_forward(q, k, v, causal=c),
                }
                if not smoke_mode():
                    sd = lambda q=q, k=k, v=v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c)
                    impls["sdpa-default(cudnn)"] = sd
                    impls["sdpa-flash(fa2)"] = _sdpa_backend("FLASH_ATTENTION")(sd)
                anchor = "sdpa-default(cudnn)" if not smoke_mode() else "flashattn-triton"
                flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
                suite.compare(
                    f"D{D}-N{N}-{'causal' if causal else 'full'}",
                    dict(B=B, H=H, N=N, D=D, causal=causal, dtype=str(dtype)),
                    impls,
                    anchor=anchor,
                    flops=flops,
                )


def _grad_fn(fwd, inputs, do):
    """A closure timing only the backward: the forward graph is built once and kept."""
    out = fwd()
    return lambda: torch.autograd.grad(out, inputs, do, retain_graph=True)


def _bwd_case(suite: Suite, B, H, N, D, causal, dtype, device) -> None:
    q, k, v = (torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, N, D, device=device, dtype=dtype)
    impls = {"flashattn-triton": _grad_fn(lambda: fa.flash_attn_forward(q, k, v, causal=causal), (q, k, v), do)}
    if not smoke_mode():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, be in (("sdpa-flash(fa2)", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(be):  # the backward kernel follows the forward's backend
                    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    impls[name] = _grad_fn(fwd, (q, k, v), do)
            except RuntimeError as e:
                print(f"  [skip] {name}: {str(e).splitlines()[0][:120]}")
    anchor = "sdpa-flash(fa2)" if "sdpa-flash(fa2)" in impls else "flashattn-triton"
    suite.compare(
        f"bwd-D{D}-N{N}-{'causal' if causal else 'full'}",
        dict(B=B, H=H, N=N, D=D, causal=causal, dtype=str(dtype)),
        impls,
        anchor=anchor,
        flops=2.5 * 4 * B * H * N * N * D * (0.5 if causal else 1.0),
    )


def _bwd(suite: Suite, sizes, dtype, device) -> None:
    D = 128
    for causal in (False, True):
        for N in sizes:
            tot = 16384 if not smoke_mode() else 128
            B, H = max(1, tot // N), max(1, (2048 if not smoke_mode() else 64) // D)
            _bwd_case(suite, B, H, N, D, causal, dtype, device)


def _decode(suite: Suite, lens, batches, dtype, device) -> None:
    H, Hkv, D = (32, 8, 128) if not smoke_mode() else (8, 2, 32)
    for B in batches:
        for L in lens:
            q = torch.randn(B, H, 1, D, device=device, dtype=dtype)
            k, v = (torch.randn(B, Hkv, L, D, device=device, dtype=dtype) for _ in range(2))
            impls = {"flashattn-triton": lambda q=q, k=k, v=v: fa.flash_attn_forward(q, k, v)}
            if not smoke_mode():
                impls["sdpa(enable_gqa)"] = lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                    q, k, v, enable_gqa=True
                )
                ke, ve = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
                impls["sdpa(expanded kv)"] = lambda q=q, k=ke, v=ve: F.scaled_dot_product_attention(q, k, v)
            anchor = "sdpa(enable_gqa)" if not smoke_mode() else "flashattn-triton"
            kv_bytes = 2 * B * Hkv * L * D * k.element_size()
            suite.compare(
                f"decode-B{B}-L{L}",
                dict(B=B, H=H, Hkv=Hkv, Nq=1, L=L, D=D, dtype=str(dtype)),
                impls,
                anchor=anchor,
                flops=4 * B * H * L * D,
                bytes=kv_bytes,
                small=True,
                note="TB/s = K/V cache bytes read / time",
            )


def run(quick: bool = False, progress=None) -> list[Record]:
    smoke = smoke_mode()
    device = "cpu" if smoke else "cuda"
    # bf16 on the GPU; fp16 in the smoke pass (bf16 tl.dot is wrong under the interpreter)
    dtype = torch.float16 if smoke else torch.bfloat16
    fwd, bwd, dec = (
        Suite("attn-fwd", progress=progress),
        Suite("attn-bwd", progress=progress),
        Suite("attn-decode", progress=progress),
    )
    if smoke:
        _fwd(fwd, (32,), (64,), dtype, device)
        _bwd(bwd, (64,), dtype, device)
        _decode(dec, (600,), (1,), dtype, device)
    elif quick:
        _fwd(fwd, (64, 128), (1024, 4096), dtype, device)
        _bwd(bwd, (1024, 4096), dtype, device)
        _decode(dec, (1024, 32768), (1,), dtype, device)
    else:
        _fwd(fwd, (64, 128), (1024, 2048, 4096, 8192, 16384), dtype, device)
        _bwd(bwd, (1024, 4096, 16384), dtype, device)
        _decode(dec, (1024, 8192, 32768), (1, 8), dtype, device)
    return fwd.records + bwd.records + dec.records
