"""GPU probe: per-phase timestamps of the prefill GEMM's fixed cost (where config 1's ~0.8 us over cuBLAS goes).

    python scripts/probe_rmsnorm_trace.py OUTDIR     (needs the probe build of
        benchmarks/results/probes/h200-probe_rmsnorm_trace.patch: config 12 = config 1 with timestamps, and the
        binding's trace_read())

Config 12 stamps %globaltimer and %clock64 at eight points of each CTA's first tile: 0 kernel entry (pipeline
setup), 1 the TMA warp starts issuing, 2 it has issued the tile's last k-tile, 3 the consumer warpgroup enters
the mainloop, 4 the first k-tile has landed, 5 every wgmma of the tile is done, 6 the epilogue is set up (after
the grid-dependency wait), 7 the epilogue's subtile loop is done (its TMA stores may still be in flight).
Cases, bf16, M1024 N2048 (128 tiles: one per CTA): K 128 and 2048, the GEMM alone on a precomputed rstd and the
module path (rstd kernel, then the GEMM as its programmatic dependent). Each traced launch reads a W copy that
is not in L2, after warm-up launches. Prints per-phase medians (cycles and ns) over the CTAs last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path += [str(d) for d in sorted((REPO / "packages").glob("*/src"))]  # a PYTHONPATH probe build wins

from fused_rmsnorm import backend  # noqa: E402
from fused_rmsnorm.ops import rmsnorm_linear as op  # noqa: E402

EPS = 1e-6
CFG = 12


PHASES = [
    ("prologue", 0, 1),
    ("issue -> consumer in", 1, 3),
    ("first k-tile wait", 3, 4),
    ("mainloop", 4, 5),
    ("epilogue setup", 5, 6),
    ("epilogue loop", 6, 7),
    ("entry -> epi done", 0, 7),
]


def trace_k(mod, M: int, N: int, K: int, dev, res: dict) -> None:
    x = (torch.randn(M, K, device=dev) * 2 + 0.3).bfloat16()
    g = (torch.rand(K, device=dev) + 0.5).bfloat16()
    ws = [(torch.randn(N, K, device=dev) / K**0.5).bfloat16() for _ in range(8)]
    wfs = [op.fold_weight(g, w) for w in ws]
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + EPS).contiguous()
    out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=dev)

    def alone(i):
        mod.gemm_sm90(
            1, CFG, x.data_ptr(), K, wfs[i].data_ptr(), K, rstd.data_ptr(), 0, out.data_ptr(), N, M, N, K,
            False, torch.cuda.current_stream().cuda_stream, 0, 1, 1, 0, 0, EPS, 0,
        )  # fmt: skip
        return out

    def module(i):
        orig = op.plan
        op.plan = lambda *a, **k: {"path": "gemm", "config": CFG, "pdl": True}
        try:
            return op.fused_rmsnorm_linear_folded(x, g, ws[i], wfs[i])
        finally:
            op.plan = orig

    ref = (xf * rstd[:, None]) @ wfs[0].float().t()
    for name, fn in (("alone", alone), ("module", module)):
        y = fn(0).float()
        torch.cuda.synchronize()
        err = ((y - ref).norm() / ref.norm()).item()
        for rep in range(3):
            for i in range(1, 8):
                fn(i)  # warm, other weights
            flush.zero_()  # W copy 0 (and x) out of L2
            torch.cuda.synchronize()
            mod.trace_read(1)  # reset
            fn(0)
            torch.cuda.synchronize()
            t = mod.trace_read(0)
            ctas = [t[c * 16 : c * 16 + 16] for c in range(132) if t[c * 16] and t[c * 16 + 14]]
            g0 = min(c[0] for c in ctas)
            row = {"K": K, "case": name, "rep": rep, "rel_err": err, "ctas": len(ctas)}
            row["entry_skew_ns"] = max(c[0] for c in ctas) - g0
            row["span_ns"] = max(c[14] for c in ctas) - g0
            for pname, s0, s1 in PHASES:
                cyc = [c[2 * s1 + 1] - c[2 * s0 + 1] for c in ctas]
                ns = [c[2 * s1] - c[2 * s0] for c in ctas]
                med = statistics.median
                row[pname] = {"cyc_median": med(cyc), "cyc_max": max(cyc), "ns_median": med(ns)}
            res["cases"].append(row)
            print(json.dumps(row), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    a = ap.parse_args()
    dev = torch.device("cuda")
    mod = backend.get_ext(dev).module
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    res.update({"cuda": torch.version.cuda, "cases": []})
    with torch.no_grad():
        for K in (128, 2048):
            trace_k(mod, 1024, 2048, K, dev, res)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "probe_rmsnorm_trace.json").write_text(json.dumps(res, indent=1))
    print(f"{'case':>14} {'skew ns':>8} {'span ns':>8} " + " ".join(f"{p[0]:>19}" for p in PHASES))
    for r in res["cases"]:
        if r["rep"] == 2:
            cells = " ".join(f"{r[p[0]]['cyc_median']:>9.0f}c{r[p[0]]['ns_median']:>7.0f}n" for p in PHASES)
            print(f"{r['case']:>8} K{r['K']:<5} {r['entry_skew_ns']:8d} {r['span_ns']:8d} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
