"""GPU probe: per-shape CUTLASS tile config + tile-scheduler knobs for the fused_rmsnorm prefill path.

    python scripts/probe_rmsnorm_prefill.py OUTDIR [--budget 120] [--rep-ms 20] [--dry-run]

Needs the extension built in place first (``python -m fused_rmsnorm._build --inplace``; the GPU runner
scripts/gpu_run.sh does that before any *rmsnorm* probe). For each shape (M, D, N) below, module path
(folded W'), bf16, PDL on:

stage 1  every SM90 tile config with CUTLASS's default scheduler (0 = 128x256 coop cluster 2,
         1 = 128x128 ping-pong, 2 = 64x128 ping-pong, 3 = 64x128 ping-pong cluster 2, 4 = 128x128 coop
         cluster 2, 5 = 256x128 coop cluster 2, 6 = 128x128 coop stream-K), the shipped table's choice
         ("shipped": the decode kernel at M=16) and for M <= 32 the tensor-core decode kernel (mma_auto),
         with F.linear on the same weights timed in the same process;
stage 2  (after stage 1 of every shape) raster order (heuristic / along M / along N) x max swizzle
         (1, 2, 4, 8) for the two fastest stage-1 configs of each shape, shapes in the order below.
Every variant is first checked against an fp32 reference (folded and functional call, max rel err
<= 1e-2, no NaN; a failure is recorded and not timed); times are harness.time_ms (CUDA-graph replay,
W rotated out of L2 where it fits), median us per call.

--budget (default 120 s) counts from the start of this script (imports, weights, references and every
check included); when it runs out the sweep stops and what was measured is still written.
Writes OUTDIR/probe_rmsnorm_prefill.json (after every shape) and OUTDIR/fragment_sm90.json: one
{"match": {"M": [lo, hi], "N": N, "K": D}} entry per shape whose best variant beats the shipped choice
by more than 2% (merge with scripts/apply_tuning.py). M ranges: [M/2 + 1, 2M] clipped to the
neighbouring probed M of the same (N, K); at M <= 16 (decode territory) only [3M/4 + 1, M].
Prints the stage-2 winners, then a table (last): us per variant, best / F.linear against the 1.08 bar.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()  # the budget includes imports and setup

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("tune_rmsnorm", REPO / "scripts" / "tune_rmsnorm.py")
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)
torch, op, harness = T.torch, T.op, T.harness

# (M, D, N): the benchmark's prefill rows and the decode shape first (the 1.08x bar), then the rest
SHAPES = [
    (128, 8192, 8192),
    (512, 4096, 4096),
    (1024, 2048, 2048),
    (4096, 4096, 4096),
    (16, 4096, 14336),
    (32, 4096, 14336),
    (256, 4096, 4096),
    (1024, 4096, 4096),
    (2048, 4096, 4096),
    (1024, 4096, 14336),
    (256, 8192, 8192),
]
CFGS = [{"path": "gemm", "config": i, "pdl": True} for i in range(op.SM90_NUM_CONFIGS)]
KNOBS = [(r, s) for r in (0, 1, 2) for s in (1, 2, 4, 8) if (r, s) != (0, 1)]  # (raster, swizzle) non-defaults
TOP = 2  # stage 2 sweeps the knobs of this many configs per shape
DECODE_MAX = 32  # shapes with M <= this also time the tensor-core decode kernel
MMA_AUTO = {"path": "decode_mma", "wn": 0, "ksplit": 0}
BAR = 1.08
RESERVE_S = 2.0  # kept for writing the results


def knob_cfg(cfg: dict, raster: int, swizzle: int) -> dict:
    c = dict(cfg)
    if raster:
        c["raster"] = raster
    if swizzle != 1:
        c["swizzle"] = swizzle
    return c


def m_range(M: int, D: int, N: int) -> list[int]:
    same = sorted(m for m, d, n in SHAPES if (d, n) == (D, N))
    i = same.index(M)
    if M <= 16:  # decode kernel territory: its time grows with M, the GEMM's barely: stay near M
        return [max(3 * M // 4 + 1, same[i - 1] + 1 if i > 0 else 1), M]
    lo = max(M // 2 + 1, same[i - 1] + 1 if i > 0 else 17)
    hi = min(2 * M, same[i + 1] - 1) if i + 1 < len(same) else 2 * M
    return [lo, hi]


class DryProbeGpu(T.DryGpu):
    """DryGpu plus a wrong result and a launch failure among the new variants (gate + error paths)."""

    def check(self, cfg, M, D, N, x, ref) -> float:
        n = T.name(cfg)
        if n == "gemm5" and M == 16:
            raise RuntimeError("fused_rmsnorm gemm_sm90: simulated launch failure")
        if n.endswith("_r2_s8"):
            return float("nan")
        return 3e-3

    def time_us(self, cfg, M, D, N, x) -> float:
        time.sleep(0.005)  # so a small --budget exercises the budget guard
        return super().time_us(cfg, M, D, N, x)

    @staticmethod
    def flinear_us(M, D, N) -> float:
        return max(N * D * 2 / 3.9e6, 2 * M * N * D / 7.0e8) + 3.0


class Budget:
    def __init__(self, seconds: float):
        self.seconds = seconds

    def elapsed(self) -> float:
        return time.perf_counter() - T_START

    def out(self) -> bool:
        return self.elapsed() > self.seconds - RESERVE_S


def measure(gpu, row: dict, key: str, cfg: dict, M, D, N, x, ref) -> None:
    """Correctness-gated timing of one variant into row["us"][key] / row["err"][key]."""
    row["cfg"][key] = cfg
    try:
        err = gpu.check(cfg, M, D, N, x, ref)
        row["err"][key] = err if math.isfinite(err) else str(err)
        if err <= T.TOL:  # NaN / inf fail too
            row["us"][key] = round(gpu.time_us(cfg, M, D, N, x), 3)
        else:
            row["failed"].append(key)
    except Exception as e:  # noqa: BLE001 - a config the binary lacks, a launch failure
        row["err"][key] = f"{type(e).__name__}: {e}"[:200]
        row["failed"].append(key)


def choose(row: dict) -> None:
    """row["best"] over every timed candidate but the shipped one and F.linear; fragment info."""
    cand = {k: v for k, v in row["us"].items() if k not in ("F.linear", "shipped")}
    if not cand:
        return
    best = min(cand, key=cand.get)
    row["best"] = best
    row["best_us"] = cand[best]
    if "F.linear" in row["us"]:
        row["best_vs_flinear"] = round(cand[best] / row["us"]["F.linear"], 3)
    if "shipped" in row["us"]:
        row["best_vs_shipped"] = round(cand[best] / row["us"]["shipped"], 3)


def write(out: Path, res: dict) -> None:
    (out / "probe_rmsnorm_prefill.json").write_text(json.dumps(res, indent=1, default=str))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--budget", type=float, default=120.0, help="seconds from script start (default 120)")
    ap.add_argument("--rep-ms", type=int, default=20, help="harness.time_ms rep per timing (default 20)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    dry = args.dry_run or not torch.cuda.is_available()
    res: dict = {"dry": dry, "budget_s": args.budget, "rows": [], "fragment": [], "notes": []}
    if dry:
        gpu = DryProbeGpu()
        print("DRY RUN (no GPU or --dry-run): synthetic timings, the output only proves the logic")
    else:
        gpu = T.Gpu()
        info = f"arch {gpu.arch}, backend {gpu.ext.kind}: {gpu.ext.reason}"
        print(info)
        res["notes"].append(info)
        if gpu.ext.kind == "torch" or not gpu.ext.has_gemm_sm90:
            res["notes"].append("no SM90 CUTLASS GEMM in the extension: nothing to probe")
            print(res["notes"][-1])
            write(out, res)
            return 1
        if gpu.ext.module.num_sm90_configs() != op.SM90_NUM_CONFIGS:
            raise SystemExit("extension and ops/rmsnorm_linear.py disagree on the SM90 config count: rebuild")
        _orig_time = gpu.time_us

        def time_us(cfg, M, D, N, x, _t=_orig_time):  # honour --rep-ms (Gpu.time_us uses rep_ms=20)
            if args.rep_ms == 20:
                return _t(cfg, M, D, N, x)
            g, w, ws = gpu.data[(D, N)]
            fns = [lambda wi=wi: op._launch_ext(x, g, w, None, T.EPS, wi) for wi in ws]
            return gpu._forced(cfg, lambda: harness.time_ms(fns, small=True, rep_ms=args.rep_ms) * 1e3)

        gpu.time_us = time_us

    state: dict = {}  # (M, D, N) -> (x, ref) kept for stage 2
    rows: list[dict] = res["rows"]
    with torch.no_grad():
        # ------------------------------------------------------------------ stage 1: every config
        for M, D, N in SHAPES:
            row = {"shape": [M, D, N], "us": {}, "err": {}, "cfg": {}, "failed": [], "stage2": [], "skipped": []}
            rows.append(row)
            shipped = op.plan(gpu.arch, M, N, D, has_gemm=True, has_mma=gpu.has_mma)
            row["shipped"] = shipped
            if budget.out():
                row["skipped"].append("all: budget")
                continue
            if not dry and (D, N) not in gpu.data:
                gpu.setup(D, N)
            x = gpu.x(M, D)
            ref = gpu.ref(M, D, N, x)
            state[(M, D, N)] = (x, ref)
            if dry:
                row["us"]["F.linear"] = round(gpu.flinear_us(M, D, N), 3)
            else:
                g, w, ws = gpu.data[(D, N)]
                wl = [wi.clone() for wi in ws]  # F.linear on the same (rotated) weights and x
                fl = [lambda wi=wi, x=x: torch.nn.functional.linear(x, wi) for wi in wl]
                row["us"]["F.linear"] = round(harness.time_ms(fl, small=True, rep_ms=args.rep_ms) * 1e3, 3)
                del wl, fl
            cands = [(T.name(c), c) for c in CFGS]
            names = {n for n, _ in cands}
            ship_n = T.name(shipped)
            if shipped.get("path") == "gemm" and ship_n in names:
                row["shipped_as"] = ship_n  # same variant: its time is copied below
            else:
                cands.insert(0, ("shipped", shipped))
            if M <= DECODE_MAX and not (shipped.get("path") == "decode_mma" and T.name(shipped) == "mma_auto"):
                cands.append(("mma_auto", MMA_AUTO))
            for key, c in cands:
                if budget.out():
                    row["skipped"].append(f"{key}: budget")
                    continue
                measure(gpu, row, key, c, M, D, N, x, ref)
            if "shipped_as" in row and row["shipped_as"] in row["us"]:
                row["us"]["shipped"] = row["us"][row["shipped_as"]]
            choose(row)
            print(json.dumps({k: row[k] for k in ("shape", "us", "failed", "skipped")}), flush=True)
            write(out, res)
        # ------------------------------------------- stage 2: raster x swizzle of the top configs
        for row in rows:
            M, D, N = row["shape"]
            if (M, D, N) not in state:
                continue
            x, ref = state[(M, D, N)]
            gem = sorted((v, k) for k, v in row["us"].items() if k.startswith("gemm"))
            top = [int(k[4:]) for _, k in gem[:TOP]]
            for c in top:
                for r, s in KNOBS:
                    cfg = knob_cfg(CFGS[c], r, s)
                    key = T.name(cfg)
                    if budget.out():
                        row["skipped"].append(f"{key}: budget")
                        continue
                    row["stage2"].append(key)
                    measure(gpu, row, key, cfg, M, D, N, x, ref)
            choose(row)
            write(out, res)
    # ------------------------------------------------------------------------------ fragment
    frag = []
    for row in rows:
        best, M, D, N = row.get("best"), *row["shape"]
        if best is None or "shipped" not in row["us"] or not row["us"][best] < 0.98 * row["us"]["shipped"]:
            continue
        cfg = row["cfg"][best]
        note = f"{row['us'][best]:.1f} vs shipped {T.name(row['shipped'])} {row['us']['shipped']:.1f} us"
        frag.append({"match": {"M": m_range(M, D, N), "N": N, "K": D}, "config": cfg, "_measured": note})
    res["fragment"] = frag
    res["wall_s"] = round(budget.elapsed(), 1)
    write(out, res)
    if frag:
        (out / "fragment_sm90.json").write_text(json.dumps(frag, indent=1))
    # ------------------------------------------------------------------------------ tables
    for row in rows:
        if row["stage2"]:
            s2 = {k: row["us"][k] for k in row["stage2"] if k in row["us"]}
            b2 = min(s2, key=s2.get) if s2 else "-"
            fails = [k for k in row["stage2"] if k in row["failed"]]
            print(
                f"stage2 {' '.join(map(str, row['shape'])):<16} {len(row['stage2'])} variants, best {b2} "
                f"{s2.get(b2, float('nan')):.1f} us" + (f"; FAILED {fails}" if fails else "")
            )
    cols = ["F.linear", "shipped"] + [T.name(c) for c in CFGS] + ["mma_auto"]
    print(f"{'M D N':<16}" + "".join(f"{c:>9}" for c in cols) + "  best (us, /F.linear, bar 1.08)")
    for row in rows:
        us = row["us"]
        cells = "".join(f"{us[c]:>9.1f}" if c in us else f"{'x' if c in row['failed'] else '-':>9}" for c in cols)
        best = row.get("best")
        tail = "-"
        if best:
            ratio = row.get("best_vs_flinear")
            ok = "" if ratio is None else (" ok" if ratio <= BAR else " MISS")
            tail = f"{best} {row['best_us']:.1f} {ratio if ratio is not None else '-'}{ok}"
        if row["skipped"]:
            tail += f" [{len(row['skipped'])} skipped: budget]"
        print(f"{' '.join(map(str, row['shape'])):<16}{cells}  {tail}")
    print(f"fragment entries: {len(frag)}; wall {res['wall_s']} s of budget {args.budget:.0f} s (x = failed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
