"""GPU probe: the prefill rstd kernel's launch shape under the SM90 PDL GEMM (ops/rmsnorm_linear.py
RSTD_SIDE): 32-warp CTAs on the SMs the GEMM's grid leaves idle (csrc/rstd.cu rstd_side_kernel) vs
8-warp CTAs on nearly every SM.

    python scripts/probe_rmsnorm_rstd.py OUTDIR

The SM90 CUTLASS GEMM CTA (384 threads x 168 registers) leaves 1024 registers of an SM free, so it cannot
start next to an 8-warp rstd CTA: with one such CTA on nearly every SM the GEMM waited for them to
retire. (A first try, one-warp CTAs of <= 32 registers beside the GEMM's, was much slower.) The
question: how much of the prefill gap to F.linear that wait was (B1024 D2048: 16.1 vs 14.8 us). Per
shape (bf16, module path with the folded W', W rotated out of L2, CUDA-graph timed): F.linear, the
module with RSTD_SIDE off ("wide"), on with the shipped RSTD_SIDE_WORK rule ("side") and on wherever
SMs are idle ("side_any": RSTD_SIDE_WORK = 0), each output against a float32 reference
(rel err <= 1e-2, NaN fails), the same three for the functional call ("fn_*": g applied per call);
and the cuBLAS kernel names F.linear runs at 1024x2048x2048.
Writes OUTDIR/probe_rmsnorm_rstd.json and prints a table.
"""

from __future__ import annotations

import json
import math
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "fused-rmsnorm" / "src"))
sys.path.insert(0, str(REPO))

from benchmarks import harness  # noqa: E402

SHAPES = [
    (1024, 2048, 2048),
    (512, 4096, 4096),
    (128, 8192, 8192),
    (4096, 4096, 4096),
    (32, 4096, 14336),
    (256, 4096, 4096),
    (1024, 4096, 14336),
]
VARIANTS = {"wide": (False, None), "side": (True, None), "side_any": (True, 0)}  # (RSTD_SIDE, RSTD_SIDE_WORK)
L2_BYTES = 50 * 2**20
EPS = 1e-6


def main() -> int:
    from fused_rmsnorm.ops import rmsnorm_linear as op
    from fused_rmsnorm.ops.rmsnorm_linear import fused_rmsnorm_linear, fused_rmsnorm_linear_folded

    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    work0 = op.RSTD_SIDE_WORK
    rows, ok = [], True
    for M, D, N in SHAPES:
        gen = torch.Generator(device=dev).manual_seed(M + D + N)
        x = (torch.randn(M, D, device=dev, generator=gen) * 2 + 0.3).bfloat16()
        g = (torch.rand(D, device=dev, generator=gen) + 0.5).bfloat16()
        w0 = (torch.randn(N, D, device=dev, generator=gen) / D**0.5).bfloat16()
        copies = min(16, max(1, math.ceil(2.5 * L2_BYTES / (N * D * 2))))
        ws = [w0] + [w0.clone() for _ in range(copies - 1)]
        wfs = [wi * g for wi in ws]
        xf = x.float()
        ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * g.float()) @ w0.float().t()
        rec = {"M": M, "D": D, "N": N, "copies": copies, "us": {}, "err": {}}
        with torch.no_grad():
            rec["us"]["F.linear"] = harness.time_ms([partial(F.linear, x, wi) for wi in ws], small=True) * 1e3
            for key, (side, work) in VARIANTS.items():
                op.RSTD_SIDE = side
                op.RSTD_SIDE_WORK = work0 if work is None else work
                # the module path (cached W') and the functional call (g on x when M < N, else W folded)
                calls = {
                    key: [partial(fused_rmsnorm_linear_folded, x, g, wi, wf, None, EPS) for wi, wf in zip(ws, wfs)],
                    "fn_" + key: [partial(fused_rmsnorm_linear, x, g, wi, None, EPS) for wi in ws],
                }
                for k, fns in calls.items():
                    y = fns[0]()
                    e = float((y.float() - ref).norm() / ref.norm())
                    rec["err"][k] = e if math.isfinite(e) else float("inf")
                    ok &= rec["err"][k] <= 1e-2
                    rec["us"][k] = harness.time_ms(fns, small=True) * 1e3
        op.RSTD_SIDE, op.RSTD_SIDE_WORK = True, work0
        cfg = int(op.plan("sm90", M, N, D, has_gemm=True).get("config", 0))
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        rec["side_ctas_rule"] = op.rstd_side_ctas(cfg, M, N, sms)
        rows.append(rec)
        u = rec["us"]
        cells = "  ".join(
            f"{k} {u[k]:.2f} ({u[k] / u['F.linear']:.3f}x)" for k in [*VARIANTS, *("fn_" + v for v in VARIANTS)]
        )
        print(f"M{M} D{D} N{N}: F.linear {u['F.linear']:.2f}  {cells}  rule ctas {rec['side_ctas_rule']}", flush=True)
        del ws, wfs
    # which cuBLAS kernel the anchor runs at the seed's shape (for the tile comparison)
    x = torch.randn(1024, 2048, device=dev).bfloat16()
    w = torch.randn(2048, 2048, device=dev).bfloat16()
    F.linear(x, w)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        F.linear(x, w)
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print("F.linear 1024x2048x2048 kernels:", kernels)
    res = {"device": torch.cuda.get_device_name(), "rows": rows, "ok": ok, "flinear_kernels_1024x2048x2048": kernels,
           "wall_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    (out_dir / "probe_rmsnorm_rstd.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
