"""GPU probe: the self-rstd decode GEMM (SM90 config 11) as a programmatic dependent of the kernel before it
(ops/rmsnorm_linear.py SELF_RSTD_PDL), against the same kernel as an ordinary launch and F.linear.

    python scripts/probe_rmsnorm_selfrstd_pdl.py OUTDIR [--rounds 5] [--off-only]

Per shape (bf16, FusedRMSNormLinear modules, 2 weight sets rotated so W streams from HBM, CUDA-graph timed by
benchmarks/harness.time_ms), in two contexts: "b2b" (calls back to back, as the benchmark suite times them)
and "after_op" (each call right after an elementwise kernel that writes its x, which does not trigger PDL).
Variants: the ordinary launch ("pdl_off") and PDL launches requesting 11 / 4 / 1 / 0 stages of W' before the
wait ("pdl_e<n>", SELF_RSTD_PDL_EARLY); their outputs must equal the off outputs bit for bit (checked first). Rounds are
interleaved; medians are reported. --off-only times F.linear and the ordinary launch only (for a binary
built before config 11 could be a PDL secondary: the same table from an older build). Writes
OUTDIR/probe_rmsnorm_selfrstd_pdl.json and prints a table (last).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "fused-rmsnorm" / "src"))
sys.path.insert(0, str(REPO))

from benchmarks import harness  # noqa: E402

SHAPES = [(16, 4096, 14336), (8, 4096, 14336), (1, 4096, 14336)]


EARLY = (11, 4, 1, 0)  # W' stages requested before the wait (SELF_RSTD_PDL_EARLY) for the PDL variants


def with_pdl(R, on: bool, fn, early: int | None = None):
    def call():
        old = R.SELF_RSTD_PDL, R.SELF_RSTD_PDL_EARLY
        R.SELF_RSTD_PDL = on
        if early is not None:
            R.SELF_RSTD_PDL_EARLY = early
        try:
            return fn()
        finally:
            R.SELF_RSTD_PDL, R.SELF_RSTD_PDL_EARLY = old

    return call


def row(M: int, D: int, N: int, rounds: int, R, FusedRMSNormLinear, off_only: bool) -> dict:
    dev = torch.device("cuda")
    torch.manual_seed(M + D + N)
    mods = []
    for _ in range(2):
        m = FusedRMSNormLinear(D, N, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            m.norm_weight.uniform_(0.5, 1.5)
            m.weight.normal_(0.0, D**-0.5)
        mods.append(m)
    src = torch.randn(M, D, device=dev).bfloat16()
    x = src.clone()
    with torch.no_grad():
        off = [with_pdl(R, False, lambda m=m: m(x))() for m in mods]
    with torch.no_grad():
        if not off_only:
            for m in mods:  # settles each W' (an ordinary launch with the switch on)
                with_pdl(R, True, lambda m=m: m(x))()
        n0 = R.SELF_RSTD_PDL_LAUNCHES[0]
        if not off_only:
            for e in EARLY:
                on = [with_pdl(R, True, lambda m=m: m(x), e)() for m in mods]
                for a, b in zip(off, on):
                    assert torch.equal(a, b), f"PDL (early {e}) changed the output at {(M, D, N)}"
            assert R.SELF_RSTD_PDL_LAUNCHES[0] - n0 == len(mods) * len(EARLY), "the PDL path did not run"

    def write_x():
        torch.add(src, 0.0, out=x)

    def nothing():
        pass

    fns = {}
    for ctx, pre in (("b2b", nothing), ("after_op", write_x)):
        fns[f"{ctx} F.linear"] = [lambda m=m, pre=pre: (pre(), F.linear(x, m.weight)) for m in mods]
        fns[f"{ctx} pdl_off"] = [with_pdl(R, False, lambda m=m, pre=pre: (pre(), m(x))) for m in mods]
        for e in EARLY if not off_only else ():
            fns[f"{ctx} pdl_e{e}"] = [with_pdl(R, True, lambda m=m, pre=pre: (pre(), m(x)), e) for m in mods]
    times = {k: [] for k in fns}
    with torch.no_grad():
        for _ in range(rounds):
            for k, f in fns.items():
                times[k].append(harness.time_ms(f, small=True, rep_ms=20) * 1e3)
    return {"M": M, "D": D, "N": N, "us": {k: statistics.median(v) for k, v in times.items()}, "us_rounds": times}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--off-only", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from fused_rmsnorm import FusedRMSNormLinear
    from fused_rmsnorm.ops import rmsnorm_linear as R

    res = {"env": harness.env_info(), "rows": []}
    for M, D, N in SHAPES:
        res["rows"].append(row(M, D, N, args.rounds, R, FusedRMSNormLinear, args.off_only))
        (args.out / "probe_rmsnorm_selfrstd_pdl.json").write_text(json.dumps(res, indent=1))
        print(f"{M}x{D}x{N}: " + " ".join(f"{k} {v:.2f}" for k, v in res["rows"][-1]["us"].items()), flush=True)
    cols = ["F.linear", "pdl_off"] + [f"pdl_e{e}" for e in EARLY]
    print("M x D x N          ctx      " + " ".join(f"{c:>9s}" for c in cols) + "   (x F.linear's time)")
    for r in res["rows"]:
        for ctx in ("b2b", "after_op"):
            us = [r["us"].get(f"{ctx} {c}", float("nan")) for c in cols]
            cells = " ".join(f"{u:9.2f}" for u in us)
            rat = " ".join(f"{u / us[0]:.3f}" for u in us[1:])
            print(f"{r['M']:3d}x{r['D']}x{r['N']:5d}  {ctx:9s}{cells}   {rat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
