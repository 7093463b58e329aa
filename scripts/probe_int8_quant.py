"""H200 probe: the per-token activation quantizer's launch shape at decode (M <= 16), end to end in Int8Linear.

    python scripts/probe_int8_quant.py OUTDIR [--budget 120] [--dry-run]

At M = 16 the quantizer is ~1.5-2.4 us of a 10-20 us Int8Linear call (module minus GEMM alone in
benchmarks/results/h200.json). ops/quantize.py packs rows so that one program holds ~8K elements (M=16, K=4096:
8 programs of 2 rows, 8 warps; K=14336: 16 programs of one 16K-padded row, 16 warps). Variants here keep one
row per program and change the warps. Per variant: quantizer output bit-identical to the shipped launch's
(same math, so any launch shape must give the same bits; else not timed), then CUDA-graph timed with the
weight copies rotated (probe_int8.bench): the quantizer alone and Int8Linear.forward (shipped GEMM table,
PDL as shipped). Writes OUTDIR/probe_int8_quant.json; prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import probe_int8 as P  # noqa: E402  (handles --dry-run: TRITON_INTERPRET, sys.path)

torch, F = P.torch, P.F
Q = P.Q

VARIANTS = {"shipped": None, "r1w4": (1, 4), "r1w8": (1, 8), "r1w16": (1, 16), "r1w32": (1, 32), "r2w16": (2, 16)}


def install(variant):
    """Replace quantize._quantize_plan for rows of decode batches by the variant's (rows, warps)."""
    Q._QPLANS.clear()
    orig = install.orig
    if variant is None:
        Q._quantize_plan = orig
        return

    def plan(R, K, x_k_contig, interp, max_one_pass, pdl):
        grid, kw = orig(R, K, x_k_contig, interp, max_one_pass, pdl)
        if R > 16 or not kw["ONE_PASS"] or interp:
            return grid, kw
        br, nw = variant
        return ((-(-R // br),), dict(kw, BLOCK_R=br, num_warps=nw))

    Q._quantize_plan = plan


install.orig = Q._quantize_plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--rep", type=int, default=6)
    args = ap.parse_args()
    t0 = time.time()
    gpu = torch.cuda.is_available() and not args.dry_run
    dev = torch.device("cuda" if gpu else "cpu")
    shapes = [(m, n, k) for m in (16, 8) for n, k in P.LLM_NK] if gpu else [(3, 200, 96)]
    recs = []
    for M, N, K in shapes:
        if time.time() - t0 > args.budget - 5:
            recs.append(dict(shape=[M, N, K], error="budget"))
            continue
        sh = P.Shape(M, N, K, dev, gpu)
        rec = dict(shape=[M, N, K], us={}, quant_us={}, exact={})
        if gpu:
            wbs = [(w.to(torch.bfloat16) * 0.01).contiguous() for w in sh.w]
            rec["us"]["bf16 F.linear"] = (
                P.bench([lambda w=w, x=sh.x: F.linear(x, w) for w in wbs], True, gpu, args.rep) * 1e3
            )
            del wbs
            rec["us"]["gemm alone"] = P.bench(sh.fns(None, "gemm"), True, gpu, args.rep) * 1e3
        install(None)  # reference: the shipped launch (same math: any launch shape must give the same bits)
        qref, sref = Q._launch_quantize_rows(sh.x)
        qt, st = Q._quantize_rows_torch(sh.x)
        rec["vs_torch"] = dict(q_mismatch=int((qref != qt).sum()), q_maxdiff=int((qref.int() - qt.int()).abs().max()))
        for name, var in VARIANTS.items():
            install(var)
            try:
                q, s = Q._launch_quantize_rows(sh.x)
                ok = bool(torch.equal(q, qref) and torch.equal(s, sref))
                rec["exact"][name] = ok
                if not ok:
                    continue
                rec["quant_us"][name] = P.bench([lambda x=sh.x: Q._launch_quantize_rows(x)], True, gpu, args.rep) * 1e3
                rec["us"][name] = P.bench(sh.fns(None, "module"), True, gpu, args.rep) * 1e3
            except Exception as e:  # noqa: BLE001
                rec["exact"][name] = f"{type(e).__name__}: {e}"[:200]
        install(None)
        recs.append(rec)
        print(f"[{time.time() - t0:5.1f}s] {M} {N} {K}: " + json.dumps({k: round(v, 2) for k, v in rec["us"].items()}))
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if gpu else None)
    (out / "probe_int8_quant.json").write_text(json.dumps(dict(env=env, records=recs), indent=1))
    print("\n| M N K | F.linear | gemm alone | " + " | ".join(f"{n} e2e (quant)" for n in VARIANTS) + " |")
    for r in recs:
        if "us" not in r:
            continue
        fl = r["us"].get("bf16 F.linear")
        cells = []
        for n in VARIANTS:
            u = r["us"].get(n)
            cells.append(
                f"{u:.2f} ({r['quant_us'][n]:.2f}){f' {fl / u:.2f}x' if fl else ''}" if u else str(r["exact"].get(n))
            )
        print(
            f"| {' '.join(map(str, r['shape']))} | {fl or 0:.2f} | {r['us'].get('gemm alone', 0):.2f} | "
            + " | ".join(cells)
            + " |"
        )
    print(f"wall {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
