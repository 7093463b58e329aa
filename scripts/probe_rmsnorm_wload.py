"""GPU probe: decode_mma `wload` variants (how W and x reach the tensor cores) vs the current kernel and F.linear.

    python scripts/probe_rmsnorm_wload.py OUTDIR [--dry-run] [--budget 45]
        [--variants WN:KS:WL[:STEPS],...] [--shapes DxN,...] [--m 1,8,16] [--check-m 1,3,16]

Needs the extension built in place (``python -m fused_rmsnorm._build --inplace``). The question: why the
decode kernel streams large weights at ~3.1-3.4 TB/s where cuBLAS reaches ~3.9 (D4096 N14336 M16:
38.4 vs 30.5 us). Variants (binding arg / tuning key ``wload``, M <= 16):
  0 = current (W register ring U=4 steps ahead, x one step ahead), the baseline;
  1 = x (and g) ride the ring too, U steps ahead (hypothesis: x's L2 round trip stalls the W stream);
  2 = 1 + W staged through smem by per-warp cp.async.bulk pipelines, 256-B row pieces x 3 stages (2 CTAs/SM);
  3 = the same with 512-B row pieces (1 CTA/SM: the auto split then sees half the slots, so wload 3 is
      also timed with fixed wn = 2 / 4).
1. Correctness (bf16, functional g-in-kernel and folded W', NaN-poisoned outputs, rel err vs a float32
   reference <= 1e-2, NaN fails): every variant at M in {1, 3, 16} x (D, N) in (4096, 4096), (4096, 14336),
   (8192, 8192). A failing variant is not timed.
2. Timing (CUDA-graph replay, W rotated over enough copies to stay out of the 50 MB L2): F.linear (the
   bar), wload 0 and every correct variant through the raw binding, folded W' (the modules' path) first,
   then the functional call; M in {1, 8, 16} x (4096, 14336), (8192, 8192), (4096, 4096).
3. OUTDIR/probe_rmsnorm_wload.json (everything), OUTDIR/tuning_sm90_wload.json (decode_mma entries, only
   for variants that are correct and >= 2% faster than wload 0; absent if none) and a table printed last.
--variants replaces the variant list (wload 0 with the heuristic split is always kept as the baseline),
--shapes / --m the timed cases (the checks run on the timed shapes plus CHECK_SHAPES' first), e.g. the
cluster K split at M=16: --variants 4:1:1,8:2:1,8:2:2,4:2:1 --shapes 4096x14336,8192x8192 --m 16.
Budget-guarded (default 45 s after the imports); --dry-run (or no GPU) runs the same logic on synthetic
numbers.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(REPO / "scripts"))
from probe_rmsnorm_decode import Budget, geomean, rel_err  # noqa: E402  (the decode probe's helpers)

CHECK_SHAPES = [(4096, 4096), (4096, 14336), (8192, 8192)]  # (D, N)
TIME_SHAPES = [(4096, 14336), (8192, 8192), (4096, 4096)]  # the failing case first
CHECK_M = [1, 3, 16]
TIME_M = [1, 8, 16]
BUCKETS = {1: (1, 1), 8: (2, 8), 16: (9, 16)}  # the M range a timed M stands for in the fragment
EPS = 1e-6
TOL = 1e-2
L2_BYTES = 50 * 2**20
WIN = 1.02  # a variant ships only if >= 2% faster than wload 0

Variant = tuple[int, ...]  # (wn, ksplit, wload[, steps]); wn = ksplit = 0: the kernel's heuristic
BASE: Variant = (0, 0, 0)
VARIANTS: list[Variant] = [BASE, (0, 0, 1), (0, 0, 2), (0, 0, 3), (4, 1, 3), (2, 1, 3)]


def vname(v: Variant) -> str:
    steps = v[3] if len(v) > 3 else 0
    return f"wl{v[2]}" + (f"_s{steps}" if steps else "") + (f"_wn{v[0]}_ks{v[1]}" if v[:2] != (0, 0) else "")


# ------------------------------------------------------------------------------------------- GPU


def case(M: int, D: int, N: int, seed: int, dev):
    gen = torch.Generator(device=dev).manual_seed(seed)
    x = (torch.randn(M, D, device=dev, generator=gen) * 2 + 0.3).bfloat16()
    g = (torch.rand(D, device=dev, generator=gen) + 0.5).bfloat16()
    w = (torch.randn(N, D, device=dev, generator=gen) / D**0.5).bfloat16()
    return x, g, w


def ref32(x, g, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * g.float()) @ w.float().t()


def run_gpu(budget: Budget) -> dict:
    from fused_rmsnorm import backend

    dev = torch.device("cuda")
    ext = backend.get_ext(dev)
    if ext.kind == "torch" or not ext.has_decode_mma:
        raise RuntimeError(f"no decode_mma in the extension ({ext.kind}: {ext.reason})")
    mod = ext.module
    out: dict = {"device": torch.cuda.get_device_name(), "backend": ext.kind, "check": [], "time": [], "notes": []}

    def call(x, g, w, y, v: Variant, folded: bool):
        M, D = x.shape
        N = w.shape[0]
        stream = torch.cuda.current_stream().cuda_stream  # per call: CUDA-graph capture runs on a side stream
        mod.decode_mma(
            1, x.data_ptr(), D, 0 if folded else g.data_ptr(), w.data_ptr(), D, 0, y.data_ptr(), N, M, N, D,
            EPS, v[0], v[1], stream, v[3] if len(v) > 3 else 0, 0, v[2],
        )  # fmt: skip

    # ---- 1. correctness
    bad: set[Variant] = set()
    for D, N in CHECK_SHAPES:
        for M in CHECK_M:
            x, g, w = case(M, D, N, seed=M * 7 + D + N, dev=dev)
            ref = ref32(x, g, w)
            wf = w * g
            for v in VARIANTS:
                for folded in (False, True):
                    y = torch.full((M, N), float("nan"), device=dev, dtype=torch.bfloat16)
                    try:
                        call(x, g, wf if folded else w, y, v, folded)
                        torch.cuda.synchronize()
                        e = rel_err(y, ref)
                    except RuntimeError as ex:
                        e = float("inf")
                        out["notes"].append(f"{vname(v)} D{D} N{N} M{M}: {str(ex)[:200]}")
                    ok = e <= TOL
                    out["check"].append(
                        {"D": D, "N": N, "M": M, "variant": vname(v), "folded": folded, "err": e, "ok": ok}
                    )
                    if not ok:
                        bad.add(v)
    n_fail = sum(not r["ok"] for r in out["check"])
    print(f"correctness: {len(out['check']) - n_fail}/{len(out['check'])} ok; failing: "
          f"{sorted(vname(v) for v in bad) or 'none'} ({budget.left():.0f}s left)")  # fmt: skip
    out["bad"] = sorted(vname(v) for v in bad)

    # ---- 2. timing: folded W' (modules) for every case first, then the functional call
    good = [v for v in VARIANTS if v not in bad]
    cases = [(D, N, M) for D, N in TIME_SHAPES for M in TIME_M]
    recs = {c: {"D": c[0], "N": c[1], "M": c[2], "us": {}} for c in cases}
    for folded in (True, False):
        for D, N in TIME_SHAPES:
            if not budget.ok(4):
                break
            wbytes = N * D * 2
            copies = min(16, max(1, math.ceil(2.5 * L2_BYTES / wbytes)))
            _, g, w0 = case(1, D, N, seed=D + N, dev=dev)
            ws = [w0] + [w0.clone() for _ in range(copies - 1)]
            src = [wi * g for wi in ws] if folded else ws
            for M in TIME_M:
                if not budget.ok(3):
                    out["notes"].append(f"budget: timing stopped before D{D} N{N} M{M} folded={folded}")
                    break
                rec = recs[(D, N, M)]
                rec["copies"], t = copies, rec["us"]
                x = (torch.randn(M, D, device=dev) * 2 + 0.3).bfloat16()
                ys = [torch.empty(M, N, device=dev, dtype=torch.bfloat16) for _ in ws]
                with torch.no_grad():
                    if folded:
                        t["F.linear"] = harness.time_ms([partial(F.linear, x, wi) for wi in ws], small=True, rep_ms=20)
                        t["F.linear"] *= 1e3
                    for v in good:
                        key = vname(v) + ("" if folded else "_fn")
                        try:
                            fns = [partial(call, x, g, wi, yi, v, folded) for wi, yi in zip(src, ys)]
                            t[key] = harness.time_ms(fns, small=True, rep_ms=20) * 1e3
                            if t[key] < wbytes / 5e6:  # faster than 5 TB/s of W: nothing was timed
                                raise RuntimeError(f"implausible {t[key]:.2f} us (W alone needs >= {wbytes / 5e6:.1f})")
                        except Exception as ex:  # one broken variant must not cost the rest of the run
                            t.pop(key, None)
                            out["notes"].append(f"timing {key} D{D} N{N} M{M}: {type(ex).__name__}: {str(ex)[:200]}")
                            torch.cuda.synchronize()
                if folded:
                    print(f"  D{D} N{N} M{M}: " + " ".join(f"{k} {u:.1f}" for k, u in t.items())
                          + f" ({budget.left():.0f}s left)")  # fmt: skip
            del ws, src
            torch.cuda.synchronize()
    out["time"] = [r for r in recs.values() if "F.linear" in r["us"] and vname(BASE) in r["us"]]
    return out


# --------------------------------------------------------------------------------------- dry run


def run_dry(budget: Budget) -> dict:
    """No GPU: the same bookkeeping on synthetic numbers (CPU torch reference for a tiny check)."""
    from fused_rmsnorm.ops.rmsnorm_linear import torch_reference

    out: dict = {"device": "dry-run (synthetic)", "check": [], "time": [], "notes": []}
    bad = {(2, 1, 3)}  # pretend one variant is broken: it must be reported, not timed, not shipped
    for v in VARIANTS:
        for M in CHECK_M:
            x, g, w = torch.randn(M, 64), torch.rand(64) + 0.5, torch.randn(24, 64) / 8
            y = torch_reference(x, g, w, None, EPS)
            if v in bad:
                y = torch.full_like(y, float("nan"))
            e = rel_err(y, ref32(x, g, w))
            out["check"].append(
                {"D": 64, "N": 24, "M": M, "variant": vname(v), "folded": True, "err": e, "ok": e <= TOL}
            )
    out["bad"] = sorted(vname(v) for v in bad)
    for D, N in TIME_SHAPES:
        for M in TIME_M:
            floor = (N * D * 2) / 4.3e6  # us at 4.3 TB/s
            t = {"F.linear": floor * 1.12 + 0.5}
            for v in VARIANTS:
                if v in bad:
                    continue
                # pretend wload 2 wins on the big weight only, wload 1 is neutral, 3 loses
                gain = {0: 1.0, 1: 1.0, 2: 0.85 if N * D > 40e6 else 1.01, 3: 1.05, 4: 0.9}[v[2]] + 0.01 * (v[0] > 0)
                t[vname(v)] = (floor * 1.25 + 0.8) * gain
                t[vname(v) + "_fn"] = t[vname(v)] + 0.1
            out["time"].append({"D": D, "N": N, "M": M, "copies": 1, "us": t})
    return out


# ----------------------------------------------------------------------------------------- report


def summarize(out: dict) -> dict:
    """Per (shape, M): the fastest correct variant (folded timings); per M bucket the tuning entries for
    variants >= WIN faster than wload 0 (one M-range entry when every shape agrees on an auto-split
    variant, else per-shape entries)."""
    by_name = {vname(v): v for v in VARIANTS}
    best: dict = {}
    for r in out["time"]:
        t = r["us"]
        cand = {k: u for k, u in t.items() if k in by_name}
        if vname(BASE) not in cand:
            continue
        k = min(cand, key=cand.get)
        best[(r["D"], r["N"], r["M"])] = {
            "best": k,
            "us": cand[k],
            "vs_wl0": t[vname(BASE)] / cand[k],
            "vs_flinear": t["F.linear"] / cand[k],
            "wl0_vs_flinear": t["F.linear"] / t[vname(BASE)],
        }
    per_variant = {}
    for name in by_name:
        rs = [r["us"][vname(BASE)] / r["us"][name] for r in out["time"] if name in r["us"]]
        if rs:
            per_variant[name] = {"geomean_vs_wl0": geomean(rs), "min_vs_wl0": min(rs), "cases": len(rs)}
    entries = []
    for M, (lo, hi) in BUCKETS.items():
        picks = {(D, N): b for (D, N, m), b in best.items() if m == M}
        wins = {s: b for s, b in picks.items() if b["best"] != vname(BASE) and b["vs_wl0"] >= WIN}
        if not wins:
            continue
        names = {b["best"] for b in picks.values()}
        v = by_name[next(iter(names))] if len(names) == 1 else None
        if v is not None and v[:2] == (0, 0) and len(wins) == len(picks):
            entries.append({"match": {"M": [lo, hi]}, "config": vconfig(v)})
            continue
        for (D, N), b in sorted(wins.items()):
            entries.append({"match": {"M": [lo, hi], "N": [N, N], "K": [D, D]}, "config": vconfig(by_name[b["best"]])})
    return {"best": {f"D{d} N{n} M{m}": b for (d, n, m), b in best.items()}, "per_variant": per_variant,
            "entries": entries}  # fmt: skip


def vconfig(v: Variant) -> dict:
    cfg = {"path": "decode_mma", "wn": v[0], "ksplit": v[1]}
    if v[2]:
        cfg["wload"] = v[2]
    if len(v) > 3 and v[3]:
        cfg["steps"] = v[3]
    return cfg


def print_table(out: dict, summ: dict) -> None:
    cols = ["F.linear"] + [vname(v) for v in VARIANTS]
    print("\nfolded W' (module path), CUDA graph, W rotated out of L2; us (TB/s of the best)")
    print(f"{'case':<18}" + "".join(f"{c:>18}" for c in cols) + f"{'best':>20}{'TB/s':>7}{'xF.lin':>8}{'xwl0':>7}")
    for r in out["time"]:
        t = r["us"]
        b = summ["best"].get(f"D{r['D']} N{r['N']} M{r['M']}")
        row = "".join(f"{t[c]:>18.2f}" if c in t else f"{'-':>18}" for c in cols)
        tail = ""
        if b:
            tbs = (r["N"] * r["D"] * 2) / (b["us"] * 1e-6) / 1e12
            tail = f"{b['best']:>20}{tbs:>7.2f}{b['vs_flinear']:>8.3f}{b['vs_wl0']:>7.3f}"
        print(f"D{r['D']} N{r['N']} M{r['M']}".ljust(18) + row + tail)
    fn = [c + "_fn" for c in cols[1:] if any(c + "_fn" in r["us"] for r in out["time"])]
    if fn:
        print("\nfunctional (g in-kernel), us")
        for r in out["time"]:
            t = r["us"]
            print(f"D{r['D']} N{r['N']} M{r['M']}".ljust(18) + "".join(f"{c}={t[c]:.2f} " for c in fn if c in t))
    print("\nper variant, F.linear-free: geomean / min of wl0 time / variant time over the cases:")
    for k, s in summ["per_variant"].items():
        print(f"  {k:<16} geomean {s['geomean_vs_wl0']:.3f}  min {s['min_vs_wl0']:.3f}  ({s['cases']} cases)")
    print(f"failing variants (not timed): {out.get('bad') or 'none'}")
    if summ["entries"]:
        print("\nSHIP (sm90 tuning.json: insert before the generic decode_mma M 1..16 entry):")
        for e in summ["entries"]:
            print("  " + json.dumps(e))
    else:
        print(f"\nno variant is correct and >= {WIN:.2f}x faster than wload 0: keep tuning.json as is")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--budget", type=float, default=45.0, help="wall-clock seconds after imports")
    ap.add_argument("--variants", default="", help="WN:KS:WL[:STEPS],... (replaces the default list)")
    ap.add_argument("--shapes", default="", help="DxN,... timed (and checked) shapes")
    ap.add_argument("--m", default="", help="timed M values (each must be 1, 8 or 16: the tuning buckets)")
    ap.add_argument("--check-m", default="", help="checked M values")
    args = ap.parse_args()
    global VARIANTS, TIME_SHAPES, CHECK_SHAPES, TIME_M, CHECK_M
    if args.variants:
        VARIANTS = [BASE] + [
            v for v in (tuple(int(a) for a in t.split(":")) for t in args.variants.split(",")) if v != BASE
        ]
    if args.shapes:
        TIME_SHAPES = [tuple(int(a) for a in t.split("x")) for t in args.shapes.split(",")]
        CHECK_SHAPES = list(dict.fromkeys(TIME_SHAPES + CHECK_SHAPES[:1]))
    if args.m:
        TIME_M = [int(a) for a in args.m.split(",")]
        if any(m not in BUCKETS for m in TIME_M):
            ap.error(f"--m values must be among {sorted(BUCKETS)}")
    if args.check_m:
        CHECK_M = [int(a) for a in args.check_m.split(",")]
    budget = Budget(args.budget)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    dry = args.dry_run or not torch.cuda.is_available()
    out: dict = {}
    try:
        out = run_dry(budget) if dry else run_gpu(budget)
    except Exception as e:  # still write what we know
        out.setdefault("notes", []).append(f"probe aborted: {type(e).__name__}: {e}")
        print(f"probe aborted: {type(e).__name__}: {e}")
    out.setdefault("time", [])
    summ = summarize(out)
    out["summary"] = summ
    out["wall_s"] = round(time.perf_counter() - budget.t0, 1)
    (args.out_dir / "probe_rmsnorm_wload.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    if summ["entries"]:
        rows = ",\n".join("  " + json.dumps(e) for e in summ["entries"])
        (args.out_dir / "tuning_sm90_wload.json").write_text("[\n" + rows + "\n]\n")
    for n in out.get("notes", []):
        print("note:", n)
    print_table(out, summ)
    print(f"\nwrote {args.out_dir}/probe_rmsnorm_wload.json in {out['wall_s']}s{' (DRY RUN)' if dry else ''}")
    if dry:
        return 0  # the dry run's failing variant is staged
    return 0 if all(r.get("ok", True) for r in out.get("check", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
