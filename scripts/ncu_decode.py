"""Decode kernels under Nsight Compute: ours next to the cuBLAS kernel F.linear picks, same shapes.

    ncu --nvtx --nvtx-include "prof/" --clock-control none --csv --metrics <list> \
        python scripts/ncu_decode.py [--cases rms,int8]   (also: rmsmod / rmsdec / rmsbig, the modules' path)

Each case runs once outside the NVTX range (compile, plan caches, autotune) and once inside the range
"prof", right after one `torch.cuda._sleep` marker kernel, so ncu profiles exactly one call of each
kernel and the markers split its CSV rows into cases (printed as "case I LABEL").
`scripts/ncu_decode.sh OUTDIR` wraps the ncu command line (metric list: duration, DRAM bytes and
throughput, L2 traffic, launch shape) and turns its CSV into OUTDIR/ncu_decode.json plus a table.
The question it answers: how much of a decode call's CUDA-graph time is the kernels' own duration,
and how cuBLAS launches the same GEMV.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
for pkg in ("fused-rmsnorm", "int8-gemm"):
    sys.path.insert(0, str(REPO / "packages" / pkg / "src"))


def rms_cases(dev):
    from fused_rmsnorm import fused_rmsnorm_linear

    for M, D, N in [(16, 4096, 14336), (1, 4096, 14336), (16, 8192, 8192)]:
        x = torch.randn(M, D, device=dev).bfloat16()
        g = (torch.rand(D, device=dev) + 0.5).bfloat16()
        w = (torch.randn(N, D, device=dev) / D**0.5).bfloat16()
        tag = f"M{M} D{D} N{N}"
        yield f"rms {tag} F.linear", lambda x=x, w=w: F.linear(x, w)
        yield f"rms {tag} fused", lambda x=x, g=g, w=w: fused_rmsnorm_linear(x, g, w)


def rms_module_cases(dev):
    """The modules' path (folded W'): at M16 D4096 N14336 the self-rstd swap-AB config 11 (one kernel), at
    M1024 D2048 N2048 the rstd kernel + the 128x128 ping-pong GEMM (config 1), next to F.linear."""
    yield from _module_cases(dev, "rmsmod", [(16, 4096, 14336), (1024, 2048, 2048)])


def rms_decode_module_cases(dev):
    """The modules' decode kernels by table: 5120^2 (the 40-row wgmma stream kernel, 1.10x F.linear's CUDA-graph
    time on the H200 in session 39), next to N14336 (2-warpgroup stream, at F.linear) and 4096^2 (decode_mma)."""
    yield from _module_cases(dev, "rmsdec", [(1, 5120, 5120), (16, 5120, 5120), (16, 4096, 14336), (1, 4096, 4096)])


def rms_big_cases(dev):
    """B4096 D4096 N4096, the prefill bar's largest case: the 128x256 cooperative GEMM (config 0) next to the
    kernel cuBLAS picks (its name gives the tile, stages and cluster)."""
    yield from _module_cases(dev, "rmsbig", [(4096, 4096, 4096)])


def _module_cases(dev, prefix, shapes):
    from fused_rmsnorm import FusedRMSNormLinear

    for M, D, N in shapes:
        x = torch.randn(M, D, device=dev).bfloat16()
        mod = FusedRMSNormLinear(D, N, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            mod.norm_weight.uniform_(0.5, 1.5)
            mod.weight.normal_(0.0, D**-0.5)
        tag = f"M{M} D{D} N{N}"
        yield f"{prefix} {tag} F.linear", lambda x=x, mod=mod: F.linear(x, mod.weight)
        yield f"{prefix} {tag} module", lambda x=x, mod=mod: mod(x)


def int8_cases(dev):
    import int8_gemm

    for M, N, K in [(16, 4096, 4096), (16, 4096, 14336), (1, 4096, 4096)]:
        lin = torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.bfloat16)
        lin8 = int8_gemm.Int8Linear.from_float(lin)
        x = torch.randn(M, K, device=dev).bfloat16()
        tag = f"M{M} N{N} K{K}"
        yield f"int8 {tag} F.linear", lambda x=x, lin=lin: lin(x)
        yield f"int8 {tag} Int8Linear", lambda x=x, lin8=lin8: lin8(x)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="rms,int8")
    ap.add_argument("--only", default="", help="comma-separated substrings: run only labels containing one")
    args = ap.parse_args()
    only = [t for t in args.only.split(",") if t]
    dev = torch.device("cuda")
    gens = {
        "rms": rms_cases,
        "rmsmod": rms_module_cases,
        "rmsdec": rms_decode_module_cases,
        "rmsbig": rms_big_cases,
        "int8": int8_cases,
    }
    with torch.no_grad():
        i = 0
        for name in args.cases.split(","):
            for label, fn in gens[name](dev):
                if only and not any(t in label for t in only):
                    continue
                fn()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push("prof")
                torch.cuda._sleep(1)  # the case marker
                fn()
                torch.cuda.nvtx.range_pop()
                torch.cuda.synchronize()
                print(f"case {i} {label}", flush=True)
                i += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
