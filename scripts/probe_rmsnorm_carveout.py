"""GPU probe: does the rstd kernel's L1 / shared-memory carveout cost the module path an SM reconfiguration?

    python scripts/probe_rmsnorm_carveout.py OUTDIR     (needs the probe build of
        benchmarks/results/probes/h200-probe_rmsnorm_carveout.patch: its _C has rstd_carveout())

The prefill module path launches the rstd kernel (a few hundred bytes of shared memory) and then the CUTLASS
GEMM (~200 KB) as its programmatic dependent. If the driver runs the rstd kernel under a small-shared-memory
split, every SM it used has to be reconfigured before a GEMM CTA can start there. This sets the rstd kernels'
preferred carveout to 100% shared (the GEMM's split) and times the module path against the default, in
interleaved rounds, with F.linear on the same weights in the same process (CUDA graphs, weight sets rotated).
Outputs must be bit-identical between the two settings. Prints a table last.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path += [str(d) for d in sorted((REPO / "packages").glob("*/src"))]  # a PYTHONPATH probe build wins

import harness  # noqa: E402
from fused_rmsnorm import FusedRMSNormLinear, backend  # noqa: E402

SHAPES = [(1024, 2048, 2048), (512, 4096, 4096), (128, 8192, 8192), (256, 4096, 4096), (4096, 4096, 4096)]
SETTINGS = {"default": -1, "shared100": 100}
ROUNDS = 3
L2_BYTES = 60 * 2**20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    a = ap.parse_args()
    dev = torch.device("cuda")
    ext = backend.get_ext(dev)
    print(f"backend {ext.kind} {getattr(ext.module, '__file__', '')}", flush=True)
    setc = ext.module.rstd_carveout
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    res.update({"cuda": torch.version.cuda, "rows": []})
    with torch.no_grad():
        for M, D, N in SHAPES:
            x = torch.randn(M, D, device=dev).bfloat16()
            mod = FusedRMSNormLinear(D, N, device=dev, dtype=torch.bfloat16)
            mod.norm_weight.uniform_(0.5, 1.5)
            mod.weight.normal_(0.0, D**-0.5)
            n = max(2, min(8, math.ceil(2 * L2_BYTES / (N * D * 2))))
            mods = [mod] + [copy.deepcopy(mod) for _ in range(n - 1)]
            for m in mods:
                m.weight.add_(torch.randn_like(m.weight) * 1e-3)  # distinct weight sets
            fns = {
                "F.linear": [lambda m=m, x=x: F.linear(x, m.weight) for m in mods],
                "module": [lambda m=m, x=x: m(x) for m in mods],
            }
            outs = {}
            for name, pct in SETTINGS.items():
                setc(pct)
                outs[name] = mods[0](x).clone()
            torch.cuda.synchronize()
            same = bool(torch.equal(outs["default"], outs["shared100"]))
            xf = x.float()
            ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * mod.norm_weight.float()) @ (
                mod.weight.float().t()
            )
            err = ((outs["default"].float() - ref).norm() / ref.norm()).item()
            for f in fns["module"] + fns["F.linear"]:
                f()
            t = {k: [] for k in ["F.linear", *(f"module {s}" for s in SETTINGS)]}
            for _ in range(ROUNDS):
                t["F.linear"].append(harness.time_ms(fns["F.linear"], small=True, rep_ms=40) * 1e3)
                for s, pct in SETTINGS.items():
                    setc(pct)
                    t[f"module {s}"].append(harness.time_ms(fns["module"], small=True, rep_ms=40) * 1e3)
            setc(-1)
            row = {"M": M, "D": D, "N": N, "bit_identical": same, "rel_err": err, "us": t}
            row["median"] = {k: round(statistics.median(v), 3) for k, v in t.items()}
            res["rows"].append(row)
            print(f"M{M} D{D} N{N}: identical {same} err {err:.2e} " + json.dumps(row["median"]), flush=True)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "probe_rmsnorm_carveout.json").write_text(json.dumps(res, indent=1))
    print(f"{'shape':>22} {'F.linear':>9} {'default':>9} {'shared100':>9}  ratio d / s100")
    for r in res["rows"]:
        md = r["median"]
        fl = md["F.linear"]
        print(
            f"{r['M']:>6}x{r['D']:>5}x{r['N']:>5}     {fl:9.2f} {md['module default']:9.2f} "
            f"{md['module shared100']:9.2f}  {md['module default'] / fl:.3f} / {md['module shared100'] / fl:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
