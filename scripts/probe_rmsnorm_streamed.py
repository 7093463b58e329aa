"""GPU probe: the streamed rstd launch (ops/rmsnorm_linear.py RSTD_STREAMED) against the rstd kernel in front
of the persistent GEMM, on the module path.

    python scripts/probe_rmsnorm_streamed.py OUTDIR

Streamed: the GEMM's persistent grid is capped 4 SMs short (where that costs no round of tiles), rstd runs on
those SMs during the mainloop, and each epilogue waits per row (csrc/gemm_sm90.cu RstdScale). Variants per shape:
F.linear, the shipped module path, the same with RSTD_STREAMED off, and (for shapes whose heuristic rasters
along M, which the streamed launch skips) the table's config forced to raster along N, with it on and off.
Every output is checked against fp32 first (<= 1e-2), then interleaved rounds are timed (CUDA graphs, weight
sets rotated out of L2). Prints a table last.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "scripts"))
sys.path += [str(d) for d in sorted((REPO / "packages").glob("*/src"))]  # a PYTHONPATH probe build wins

from fused_rmsnorm.ops import rmsnorm_linear as op  # noqa: E402
from rmsnorm_probe_cases import EPS, L2_BYTES, ROUNDS, checked_row, finish, module_copies, start  # noqa: E402

SHAPES = [(4096, 4096, 4096), (8192, 4096, 4096), (4096, 8192, 8192), (2048, 4096, 4096), (4096, 4096, 14336)]
FORCE: list = [None]  # knobs merged into the table's plan for one call (None: the table's)
_plan = op.plan


def forced_plan(arch, M, N, K, **kw):
    p = _plan(arch, M, N, K, **kw)
    return p if FORCE[0] is None else {**p, **FORCE[0]}


op.plan = forced_plan


def variant(m, x, streamed: bool, force):
    def run():
        FORCE[0], op.RSTD_STREAMED = force, streamed
        try:
            return m(x)
        finally:
            FORCE[0], op.RSTD_STREAMED = None, True

    return run


def measure(M, D, N, dev):
    x, mods = module_copies(M, D, N, dev, L2_BYTES)
    p = _plan(op.arch_key(dev), M, N, D, has_gemm=True, sms=op.num_sms(dev))
    sms = op.num_sms(dev)
    fns = {
        "F.linear": [lambda m=m: F.linear(x, m.weight) for m in mods],
        "module": [variant(m, x, True, None) for m in mods],
        "module unstreamed": [variant(m, x, False, None) for m in mods],
    }
    streams = {"module": op.rstd_streamed(p.get("config", -1), M, N, sms, p.get("raster", 0))}
    if not streams["module"][0]:
        f = {"raster": 2}
        fns["rasterN streamed"] = [variant(m, x, True, f) for m in mods]
        fns["rasterN unstreamed"] = [variant(m, x, False, f) for m in mods]
        streams["rasterN streamed"] = op.rstd_streamed(p.get("config", -1), M, N, sms, 2)
    outs = {k: v[0]().clone() for k, v in fns.items()}
    torch.cuda.synchronize()
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + EPS)
    ref = (xf * rstd[:, None] * mods[0].norm_weight.float()) @ mods[0].weight.float().t()
    row = checked_row(M, D, N, p, fns, outs, ref, ROUNDS, {})
    row["streamed"] = streams
    return row


def main() -> int:
    out_dir, dev, ext, res = start(__doc__)
    with torch.no_grad():
        res["rows"] = [measure(M, D, N, dev) for M, D, N in SHAPES]
    return finish(out_dir, "probe_rmsnorm_streamed", res, lambda r: f"cfg {r['plan'].get('config')} {r['streamed']}")


if __name__ == "__main__":
    sys.exit(main())
