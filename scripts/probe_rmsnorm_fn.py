"""GPU probe: the functional call (no cached W') at decode, its table choice against the stream kernel on x * g.

    python scripts/probe_rmsnorm_fn.py OUTDIR

Session 38 let a functional call run the "stream" decode kernel: rstd_scale writes x * g and rstd in one pass
over x, then the kernel streams W (not W') and takes that rstd. This times, per decode shape, in interleaved
rounds (CUDA graphs, weight sets rotated out of L2): F.linear, the unfused pair, the module (table), the
functional call with the table's choice ("fn", decode_mma for most rows), and the functional call forced onto
the module entry's stream config ("fn stream", where the module entry is a stream one), after a check of every
output against the fp32 reference (rows far apart in scale). Prints a table last. PROBE_FN_DECODE=1 (session 49)
also times the functional call forced onto the CUDA-core GEMV ("fn decode") and onto decode_mma ("fn decode_mma");
PROBE_FN_DECODE_SPLITS="8,4,2,1" (session 50) adds the GEMV with each K split forced ("fn decode k8", ...).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "scripts"))
sys.path += [str(d) for d in sorted((REPO / "packages").glob("*/src"))]  # a PYTHONPATH probe build wins

from fused_rmsnorm import fused_rmsnorm_linear  # noqa: E402
from fused_rmsnorm.ops import rmsnorm_linear as op  # noqa: E402
from rmsnorm_probe_cases import EPS, L2_BYTES, checked_row, finish, module_copies, start  # noqa: E402

SHAPES = [(m, d, n) for d, n in ((4096, 14336), (8192, 8192)) for m in (1, 8, 16)]
SHAPES += [(1, 5120, 5120), (16, 5120, 5120)]
if os.environ.get("PROBE_SHAPES"):  # e.g. "1x4096x14336,16x5120x5120" (M x D x N)
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ["PROBE_SHAPES"].split(",")]
ROUNDS = 5
_plan = op.plan
FORCE: list = [None]


def forced_plan(arch, M, N, K, **kw):
    return _plan(arch, M, N, K, **kw) if FORCE[0] is None else dict(FORCE[0])


op.plan = forced_plan


def _forced(cfg, f):
    def run():
        FORCE[0] = cfg
        try:
            return f()
        finally:
            FORCE[0] = None

    return run


def measure(M: int, D: int, N: int, dev) -> dict:
    x, mods = module_copies(M, D, N, dev, L2_BYTES)
    arch, sms = op.arch_key(dev), op.num_sms(dev)
    mplan = _plan(arch, M, N, D, has_gemm=True, folded=True, sms=sms)
    fplan = _plan(arch, M, N, D, has_gemm=True, folded=False, sms=sms)
    fns = {
        "F.linear": [lambda m=m: F.linear(x, m.weight) for m in mods],
        "unfused": [lambda m=m: F.linear(F.rms_norm(x, (D,), m.norm_weight, EPS), m.weight) for m in mods],
        "module": [lambda m=m: m(x) for m in mods],
        "fn": [lambda m=m: fused_rmsnorm_linear(x, m.norm_weight, m.weight, eps=EPS) for m in mods],
    }
    if mplan["path"] == "stream":
        cfg = {k: v for k, v in mplan.items()}
        fns["fn stream"] = [
            _forced(cfg, lambda m=m: fused_rmsnorm_linear(x, m.norm_weight, m.weight, eps=EPS)) for m in mods
        ]
    if M <= 16 and os.environ.get("PROBE_FN_DECODE"):  # session 49: the CUDA-core GEMV, which applies g itself
        forced = {"fn decode": {"path": "decode", "ksplit": 0, "grid_blocks": 0}}
        forced["fn decode_mma"] = {"path": "decode_mma", "wn": 0, "ksplit": 0}
        for s in os.environ.get("PROBE_FN_DECODE_SPLITS", "").split(","):  # session 50, e.g. "8,4,2,1"
            if s:
                forced[f"fn decode k{s}"] = {"path": "decode", "ksplit": int(s), "grid_blocks": 0}
        for name, cfg in forced.items():
            fns[name] = [
                _forced(cfg, lambda m=m: fused_rmsnorm_linear(x, m.norm_weight, m.weight, eps=EPS)) for m in mods
            ]
    outs = {k: v[0]().clone() for k, v in fns.items()}
    torch.cuda.synchronize()
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + EPS)
    ref = (xf * rstd[:, None] * mods[0].norm_weight.float()) @ mods[0].weight.float().t()
    row = checked_row(M, D, N, {"module": mplan, "fn": fplan}, fns, outs, ref, ROUNDS, {})
    return row


def main() -> int:
    out_dir, dev, ext, res = start(__doc__)
    with torch.no_grad():
        res["rows"] = [measure(M, D, N, dev) for M, D, N in SHAPES]
    return finish(out_dir, "probe_rmsnorm_fn", res, tag=lambda r: f"fn {r['plan']['fn'].get('path')}")


if __name__ == "__main__":
    sys.exit(main())
