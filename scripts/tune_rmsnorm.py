"""Choose the fused_rmsnorm kernel per row count M on this GPU; write a tuning.json table.

    python scripts/tune_rmsnorm.py OUT_DIR [--budget SECONDS] [--dry-run]

For M in {1, 2, 4, 8, 16, 32, 64, 128} and (D, N) in {(4096, 4096), (4096, 14336), (2048, 2048),
(8192, 8192)} (bf16, module path: folded W' = W * g) it
1. checks every candidate against an fp32 reference on that shape (max rel err <= 1e-2, no NaN;
   a candidate that fails, or fails to launch, on any shape is dropped for that M),
2. times it as the benchmarks do: CUDA-graph replay, W rotated over enough copies that it never
   sits in the 50 MB L2 (a real decode step reads W from HBM),
3. picks per M the candidate with the best geometric-mean time over the shapes.
Candidates: the tensor-core decode kernel with its one-wave auto split, a few fixed (wn, ksplit)
near one wave (ksplit > 1 = thread-block clusters, sm_90 only), for M <= 16 the kernel's compiled
variants (steps = 8 W loads in flight per lane and / or plain instead of evict_first W loads, config
keys "steps" / "ldpolicy") with the auto split, the CUDA-core decode kernel where
there is no tensor-core one, and the CUTLASS GEMM tile configs for M >= 16.
Consecutive M with the same winner become one {"match": {"M": [lo, hi]}} entry; M above the last
timed M keep the shipped entries (clipped), so a sweep stopped by --budget (default 60 s, counted
from the first timing; about 25-40 s are needed on an H200) still writes a complete table.

Writes OUT_DIR/tuning.json (this arch's entries replaced, the other arches copied; the GPU runner
installs it) and OUT_DIR/tune_rmsnorm.json (every time / error), then prints a table. With
--dry-run or without a GPU it runs the same selection / writing logic on synthetic timings and
writes OUT_DIR/tuning.dry.json instead (never tuning.json).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "fused-rmsnorm" / "src"))

from fused_rmsnorm import backend  # noqa: E402
from fused_rmsnorm.ops import rmsnorm_linear as op  # noqa: E402

sys.path.insert(0, str(REPO))
from benchmarks import harness  # noqa: E402

MS = [1, 2, 4, 8, 16, 32, 64, 128]
SHAPES = [(4096, 4096), (4096, 14336), (2048, 2048), (8192, 8192)]
MMA_MAX = 64  # decode kernels are candidates up to this M
GEMM_MIN = 16  # GEMM configs from this M
EXPLICIT_MAX = 32  # fixed (wn, ksplit) candidates up to this M (auto covers the rest)
VARIANT_MAX = 16  # decode_mma (steps, ldpolicy) variants: compiled for <= 16 tokens per CTA only
# (steps, ldpolicy) besides the default (4, evict_first), each tried with the one-wave auto split
VARIANTS = [(8, "evict_first"), (4, "plain"), (8, "plain")]
EPS = 1e-6
TOL = 1e-2
L2_BYTES = 50 * 2**20
SHIPPED = REPO / "packages/fused-rmsnorm/src/fused_rmsnorm/tuning.json"


def candidates(arch: str, M: int, has_mma: bool) -> list[dict]:
    c: list[dict] = []
    if M <= MMA_MAX:
        if has_mma:
            c.append({"path": "decode_mma", "wn": 0, "ksplit": 0})
            if M <= EXPLICIT_MAX:
                # the measured H200 winners of the four shapes (224-256 CTAs = one wave) and neighbours
                pairs = [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (8, 2)] if arch == "sm90" else [(1, 1), (2, 1), (4, 1)]
                c += [{"path": "decode_mma", "wn": w, "ksplit": k} for w, k in pairs]
            if M <= VARIANT_MAX:
                c += [{"path": "decode_mma", "wn": 0, "ksplit": 0, "steps": s, "ldpolicy": p} for s, p in VARIANTS]
        else:
            c.append({"path": "decode", "ksplit": 0, "grid_blocks": 0})
    if M >= GEMM_MIN:
        if arch == "sm90":
            c += [{"path": "gemm", "config": i, "pdl": True} for i in (0, 1, 2)]
        elif arch.startswith("sm8"):
            c += [{"path": "gemm", "config": i} for i in (0, 1)]
    return c


def name(cfg: dict) -> str:
    if cfg["path"] == "decode_mma":
        n = "mma_auto" if cfg["wn"] == 0 and cfg["ksplit"] == 0 else f"mma_wn{cfg['wn']}_ks{cfg['ksplit']}"
        if "steps" in cfg:
            n += f"_s{cfg['steps']}" + ("p" if cfg["ldpolicy"] == "plain" else "")
        return n
    if cfg["path"] == "decode":
        return "decode"
    n = f"gemm{cfg['config']}"
    if cfg.get("raster", 0):  # sm90 tile-scheduler knobs, shown only when not the default
        n += f"_r{cfg['raster']}"
    if cfg.get("swizzle", 1) != 1:
        n += f"_s{cfg['swizzle']}"
    if cfg.get("splits", 1) != 1:
        n += f"_k{cfg['splits']}"
    return n


# ------------------------------------------------------------------------------------------- GPU


class Gpu:
    def __init__(self):
        from fused_rmsnorm._common import arch_key

        self.dev = torch.device("cuda")
        self.arch = arch_key(self.dev)
        self.ext = backend.get_ext(self.dev)
        self.has_mma = torch.cuda.get_device_capability(self.dev)[0] >= 8 and self.ext.has_decode_mma
        self.data: dict = {}

    def setup(self, D: int, N: int):
        """Weight copies for rotation (folded W' as the modules hold it) and the unfolded W / g."""
        gen = torch.Generator(device=self.dev).manual_seed(D * 7 + N)
        g = (torch.rand(D, device=self.dev, generator=gen) + 0.5).bfloat16()
        w = (torch.randn(N, D, device=self.dev, generator=gen) / D**0.5).bfloat16()
        wf = op.fold_weight(g, w)
        copies = min(16, max(1, math.ceil(2.5 * L2_BYTES / (N * D * 2))))
        self.data[(D, N)] = (g, w, [wf] + [wf.clone() for _ in range(copies - 1)])

    @staticmethod
    def _forced(cfg: dict, fn):
        orig = op.plan
        op.plan = lambda *a, **k: dict(cfg)  # force this candidate through the real launcher
        try:
            return fn()
        finally:
            op.plan = orig

    def x(self, M: int, D: int):
        gen = torch.Generator(device=self.dev).manual_seed(M * 131 + D)
        return (torch.randn(M, D, device=self.dev, generator=gen) * 2 + 0.3).bfloat16()

    def check(self, cfg: dict, M: int, D: int, N: int, x, ref) -> float:
        """Max rel err of the folded (module) and functional calls vs the fp32 reference (inf: NaN)."""
        g, w, ws = self.data[(D, N)]
        errs = []
        for fn in (lambda: op._launch_ext(x, g, w, None, EPS, ws[0]), lambda: op._launch_ext(x, g, w, None, EPS)):
            y = self._forced(cfg, fn).float()
            torch.cuda.synchronize()
            if not torch.isfinite(y).all():
                return float("inf")
            errs.append(((y - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item())
        return max(errs)

    def ref(self, M: int, D: int, N: int, x):
        g, w, _ = self.data[(D, N)]
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * g.float()) @ w.float().t()

    def time_us(self, cfg: dict, M: int, D: int, N: int, x) -> float:
        """Median us per call, CUDA-graph replay rotating over the weight copies (harness.time_ms)."""
        g, w, ws = self.data[(D, N)]
        fns = [lambda wi=wi: op._launch_ext(x, g, w, None, EPS, wi) for wi in ws]
        orig = op.plan
        op.plan = lambda *a, **k: dict(cfg)  # force this candidate through the real launcher
        try:
            return harness.time_ms(fns, small=True, rep_ms=20) * 1e3
        finally:
            op.plan = orig


class DryGpu:
    """Synthetic stand-in: same selection / writing logic, no GPU. One candidate is made wrong to
    exercise the correctness gate."""

    arch = "sm90"
    has_mma = True

    def setup(self, D, N):
        pass

    def x(self, M, D):
        return None

    def ref(self, M, D, N, x):
        return None

    def check(self, cfg, M, D, N, x, ref) -> float:
        return float("nan") if name(cfg) == "mma_wn2_ks2" else 3e-3

    def time_us(self, cfg, M, D, N, x) -> float:
        w_us = N * D * 2 / 3.9e6
        if cfg["path"] == "decode_mma":
            wn, ks = cfg["wn"], cfg["ksplit"]
            if wn == 0:
                deep = 0.9 if cfg.get("steps") == 8 and M <= 8 else 1.0  # pretend the deep ring helps M <= 8
                return w_us * (1.15 + 0.01 * M) * deep + 2
            ctas = math.ceil(N / (16 * wn)) * math.ceil(M / 32) * ks
            return w_us * (1.15 + 0.01 * M) * (1.1 if ctas > 264 or ctas < 132 else 1.0) + 2 + ks
        if cfg["path"] == "decode":
            return w_us * 1.3 * math.ceil(M / 8) + 2
        c = cfg["config"]
        tm = {0: 128, 1: 128, 2: 64, 3: 64, 4: 128, 5: 256, 6: 128}[c]
        tn = {0: 256, 1: 128, 2: 128, 3: 128, 4: 128, 5: 128, 6: 128}[c]
        tiles = math.ceil(M / tm) * math.ceil(N / tn)
        waves = tiles / 132 if c == 6 else math.ceil(tiles / 132)  # stream-K evens out the last wave
        knob = 1.0 - 0.01 * (cfg.get("raster", 0) == 1) - 0.005 * math.log2(cfg.get("swizzle", 1))
        return (max(w_us * (0.98 if c == 3 else 1.05), waves * tm * tn * D * 2 / 6.0e6) + 4.0) * knob


# ----------------------------------------------------------------------------------- table logic


def build_entries(best: dict[int, dict], shipped: list[dict]) -> list[dict]:
    """Tuned M ranges (M between tuned points takes the next tuned point's winner), then the shipped
    entries for M above the last tuned point (M-ranged ones clipped, unranged ones kept in order)."""
    entries: list[dict] = []
    lo = 1
    ms = sorted(best)
    for i, m in enumerate(ms):
        if i + 1 < len(ms) and best[ms[i + 1]] == best[m]:
            continue  # extends into the next range
        entries.append({"match": {"M": [lo, m]}, "config": best[m]})
        lo = m + 1
    top = ms[-1] if ms else 0
    for e in shipped:
        rng = e.get("match", {}).get("M")
        if rng is None:
            entries.append(e)
        elif rng[1] > top:
            entries.append({**e, "match": {**e["match"], "M": [max(rng[0], top + 1), rng[1]]}})
    return entries


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--budget", type=float, default=60.0, help="seconds of sweeping (default 60)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    dry = args.dry_run or not torch.cuda.is_available()
    if dry:
        gpu = DryGpu()
        print("DRY RUN (no GPU or --dry-run): synthetic timings, the output only proves the logic")
    else:
        gpu = Gpu()
        print(f"arch {gpu.arch}, backend {gpu.ext.kind}: {gpu.ext.reason}; decode_mma {gpu.has_mma}")
        if gpu.ext.kind == "torch":
            print("no CUDA extension: nothing to tune")
            return 1
    for D, N in SHAPES:
        gpu.setup(D, N)
    t0 = time.perf_counter()
    best: dict[int, dict] = {}
    log: dict = {"arch": gpu.arch, "dry": dry, "budget_s": args.budget, "rows": [], "dropped": [], "notes": []}
    with torch.no_grad():
        for M in MS:
            if time.perf_counter() - t0 > args.budget:
                log["notes"].append(f"budget of {args.budget:.0f}s reached; M >= {M} keep the shipped entries")
                print(log["notes"][-1])
                break
            cands = candidates(gpu.arch, M, gpu.has_mma)
            times: dict[str, list[float]] = {name(c): [] for c in cands}
            dead: set[str] = set()
            out_of_time = False
            for D, N in SHAPES:
                x = gpu.x(M, D)
                ref = gpu.ref(M, D, N, x)
                for c in cands:
                    n = name(c)
                    if n in dead:
                        continue
                    if time.perf_counter() - t0 > args.budget:
                        out_of_time = True
                        break
                    try:
                        err = gpu.check(c, M, D, N, x, ref)
                        if not err <= TOL:  # NaN fails too
                            raise ValueError(f"rel err {err:.3g} > {TOL}")
                        times[n].append(gpu.time_us(c, M, D, N, x))
                    except Exception as e:  # wrong result, a config the binary lacks, a launch failure
                        dead.add(n)
                        log["dropped"].append(
                            {"M": M, "D": D, "N": N, "cand": n, "why": f"{type(e).__name__}: {e}"[:200]}
                        )
                        print(f"  drop {n} at M={M} D={D} N={N}: {log['dropped'][-1]['why']}")
                if out_of_time:
                    break
            if out_of_time:  # a half-timed M is not used: it keeps the shipped entry
                log["notes"].append(
                    f"budget of {args.budget:.0f}s reached during M={M}; M >= {M} keep the shipped entries"
                )
                print(log["notes"][-1])
                break
            scores = {
                n: math.exp(sum(math.log(t) for t in ts) / len(ts))
                for n, ts in times.items()
                if n not in dead and len(ts) == len(SHAPES)
            }
            row = {"M": M, "us": {n: times[n] for n in scores}, "geomean_us": scores}
            if scores:
                win = min(scores, key=scores.get)
                best[M] = next(c for c in cands if name(c) == win)
                row["winner"] = win
            log["rows"].append(row)
    table = json.loads(SHIPPED.read_text())
    table[gpu.arch] = build_entries(best, table.get(gpu.arch, []))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / ("tuning.dry.json" if dry else "tuning.json")
    out.write_text(json.dumps(table, indent=2) + "\n")
    log["wall_s"] = round(time.perf_counter() - t0, 1)
    (args.out_dir / ("tune_rmsnorm.dry.json" if dry else "tune_rmsnorm.json")).write_text(json.dumps(log, indent=1))
    # compact table last: geomean us over the shapes per candidate, winner per M
    names = sorted({n for r in log["rows"] for n in r["geomean_us"]}, key=lambda n: (n.startswith("gemm"), n))
    print(f"{'M':>4} " + " ".join(f"{n:>12}" for n in names) + "  winner   (geomean us over D,N shapes)")
    for r in log["rows"]:
        cells = " ".join(f"{r['geomean_us'][n]:>12.1f}" if n in r["geomean_us"] else f"{'-':>12}" for n in names)
        print(f"{r['M']:>4} {cells}  {r.get('winner', '-')}")
    print(f"wrote {out} ({len(table[gpu.arch])} entries for {gpu.arch}); swept {log['wall_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
