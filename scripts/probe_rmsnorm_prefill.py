"""GPU probe: per-shape CUTLASS tile choice for the fused_rmsnorm prefill path (M > 16).

    python scripts/probe_rmsnorm_prefill.py OUTDIR [--budget 45] [--dry-run]

The shipped sm90 table picks the GEMM tile by M bucket / M*N only. For each prefill shape below
(the benchmark's plus common LLM projections) this checks the module path (folded W') of every
CUTLASS config (0 = 128x256 coop cluster-2, 1 = 128x128 ping-pong, 2 = 64x128 ping-pong; PDL on)
against an fp32 reference (max rel err <= 1e-2, no NaN), times it as bench_rmsnorm does
(benchmarks/harness.time_ms: CUDA graph, W rotated out of L2 where it fits), with F.linear timed
in the same process, and writes OUTDIR/probe_rmsnorm_prefill.json plus OUTDIR/fragment_sm90.json:
one {"match": {"M": [lo, hi], "N": N, "K": D}} entry per shape whose best config beats the
shipped choice by more than 2% (merge with scripts/apply_tuning.py). M ranges: [M/2 + 1, 2M]
clipped to the neighbouring probed M of the same (N, K). Prints a table last.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("tune_rmsnorm", REPO / "scripts" / "tune_rmsnorm.py")
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)
torch, op, harness = T.torch, T.op, T.harness

# (M, D, N): the benchmark's prefill rows first, then common projections
SHAPES = [
    (128, 8192, 8192),
    (512, 4096, 4096),
    (1024, 2048, 2048),
    (4096, 4096, 4096),
    (256, 4096, 4096),
    (1024, 4096, 4096),
    (2048, 4096, 4096),
    (1024, 4096, 14336),
    (256, 8192, 8192),
]
CFGS = [{"path": "gemm", "config": i, "pdl": True} for i in (0, 1, 2)]


def m_range(M: int, D: int, N: int) -> list[int]:
    same = sorted(m for m, d, n in SHAPES if (d, n) == (D, N))
    i = same.index(M)
    lo = max(M // 2 + 1, same[i - 1] + 1 if i > 0 else 17)
    hi = min(2 * M, same[i + 1] - 1) if i + 1 < len(same) else 2 * M
    return [lo, hi]


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    budget = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 45.0
    dry = "--dry-run" in sys.argv or not torch.cuda.is_available()
    gpu = T.DryGpu() if dry else T.Gpu()
    rows, frag = [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        for M, D, N in SHAPES:
            if time.perf_counter() - t0 > budget:
                rows.append({"shape": [M, D, N], "skipped": "budget"})
                continue
            gpu.setup(D, N)
            x = gpu.x(M, D)
            ref = gpu.ref(M, D, N, x)
            shipped = (
                op.plan(gpu.arch, M, N, D, has_gemm=True, has_mma=gpu.has_mma)
                if not dry
                else {"path": "gemm", "config": 1}
            )
            row = {"shape": [M, D, N], "shipped": shipped, "us": {}, "err": {}}
            if not dry:
                g, w, ws = gpu.data[(D, N)]
                wl = [wi.clone() for wi in ws]  # F.linear on the same (rotated) weights and x
                fl = [lambda wi=wi, x=x: torch.nn.functional.linear(x, wi) for wi in wl]
                row["us"]["F.linear"] = harness.time_ms(fl, small=True, rep_ms=20) * 1e3
                del wl
            for c in CFGS:
                n = T.name(c)
                try:
                    err = gpu.check(c, M, D, N, x, ref)
                    row["err"][n] = err
                    if err <= T.TOL:
                        row["us"][n] = gpu.time_us(c, M, D, N, x)
                except Exception as e:  # noqa: BLE001 - a config the binary lacks, a launch failure
                    row["err"][n] = f"{type(e).__name__}: {e}"[:200]
            cand = {k: v for k, v in row["us"].items() if k.startswith("gemm")}
            if cand:
                best = min(cand, key=cand.get)
                ship_n = T.name(shipped) if shipped.get("path") == "gemm" else None
                row["best"] = best
                if ship_n in cand and cand[best] < 0.98 * cand[ship_n]:
                    cfg = next(c for c in CFGS if T.name(c) == best)
                    note = f"{cand[best]:.1f} vs shipped {ship_n} {cand[ship_n]:.1f} us"
                    frag.append({"match": {"M": m_range(M, D, N), "N": N, "K": D}, "config": cfg, "_measured": note})
            rows.append(row)
            print(json.dumps(row), flush=True)
    res = {"dry": dry, "rows": rows, "fragment": frag, "wall_s": round(time.perf_counter() - t0, 1)}
    (out / "probe_rmsnorm_prefill.json").write_text(json.dumps(res, indent=1, default=str))
    if frag:
        (out / "fragment_sm90.json").write_text(json.dumps(frag, indent=1))
    names = ["F.linear"] + [T.name(c) for c in CFGS]
    print(f"{'M D N':<18}" + "".join(f"{n:>10}" for n in names) + "  shipped -> best")
    for r in rows:
        if "skipped" in r:
            print(f"{str(r['shape']):<18} skipped")
            continue
        cells = "".join(f"{r['us'][n]:>10.1f}" if n in r["us"] else f"{'-':>10}" for n in names)
        print(f"{' '.join(map(str, r['shape'])):<18}{cells}  {T.name(r['shipped'])} -> {r.get('best', '-')}")
    print(f"fragment entries: {len(frag)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
