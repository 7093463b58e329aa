"""GPU probe: the cp.async-ring decode kernel (path "stream", csrc/decode_stream.cu) against the table's decode
choice and F.linear, module path.

    python scripts/probe_rmsnorm_stream.py OUTDIR

Session 28's Triton prototype of this kernel (scripts/probe_gemv_stream.py) took 30.15 us at B16 D4096 N14336
against F.linear's 30.60 and the shipped config 11's 31.48. This times the CUDA C++ kernel's (bn, stages)
variants at the decode shapes of the suite and its neighbours, after a check against the fp32 reference (rows
far apart in scale), in interleaved rounds (CUDA graphs, weight sets rotated out of L2). Prints a table last.

Session 30 added the sm_90a twin (wgmma from shared memory, what the Triton prototype compiles to), with and
without the proxy fence: VARIANTS names each forced entry; PROBE_VARIANTS="name,name" picks some. Session 31:
variants with fewer W' rows per CTA than bn ("rows", named "... rN") so N / rows CTAs cover more of the SMs
(N 14336: 128 CTAs of 112 rows; 5120: 128 of 40). Session 43: the K split over a cluster, "... sN" after a variant
name, and "auto sN", rows "auto" with only the split N (e.g. "auto s1", session 41's rule, against the table).
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

from fused_rmsnorm.ops import rmsnorm_linear as op  # noqa: E402
from rmsnorm_probe_cases import EPS, L2_BYTES, checked_row, finish, flagged_call, module_copies, start  # noqa: E402

SHAPES = [(m, d, n) for d, n in ((4096, 14336), (8192, 8192)) for m in (1, 8, 16)]
SHAPES += [(1, 5120, 5120), (16, 5120, 5120), (16, 4096, 4096)]
if os.environ.get("PROBE_SHAPES"):  # e.g. "1x4096x14336,16x5120x5120" (M x D x N): a confirming run
    SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ["PROBE_SHAPES"].split(",")]
ROUNDS = 5
_plan = op.plan
FORCE: list = [None]
_WG = {"wgmma": True}
VARIANTS = {f"sync {bn}x{st}": {"bn": bn, "stages": st} for bn, st in ((128, 4), (64, 6))}
for bn, st, g, r in op.STREAM_WG_VARIANTS:
    VARIANTS[f"wg{g} {bn}x{st}" + (f" r{r}" if r != bn else "")] = {
        **_WG,
        "bn": bn,
        "stages": st,
        "warpgroups": g,
        "rows": r,
    }
# timed only when PROBE_VARIANTS names it (session 30's run 2: the fence cost 0-0.8 us)
EXTRA = {"wg1 64x4 fence": {**_WG, "bn": 64, "stages": 4, "proxy_fence": True}}
# session 41: the tensor-core decode kernel's default (the sm90 catch-all before rows "auto"), for comparison
EXTRA["decode_mma"] = {"path": "decode_mma", "wn": 0, "ksplit": 0}
# session 49: the CUDA-core GEMV (decode.cu, the pre-sm_80 path; K split inside the block) at small N, where
# cuBLAS's own CUDA-core gemv beat its tensor-core kernel (H100 s49: D2056 N300 M1 3.35 us vs D2048 N256 4.82)
EXTRA["decode"] = {"path": "decode", "ksplit": 0, "grid_blocks": 0}
# session 50: the GEMV with its K split forced ("decode k8": 8 warps on one W row), against its one-wave rule
EXTRA.update({f"decode k{s}": {"path": "decode", "ksplit": s, "grid_blocks": 0} for s in (1, 2, 4, 8)})
# session 43: rows "auto" resolved with only these K splits ("auto s1": session 41's rule), per shape
EXTRA.update({f"auto s{s}": {"auto_splits": (s,)} for s in (1, 2, 4, 8)})
EXTRA["stream auto"] = {"auto_splits": op.STREAM_SPLITS}  # session 50: rows "auto" as the catch-all entry runs it
if os.environ.get("PROBE_VARIANTS"):
    # a named wgmma variant with " sN" appended runs with the K split N, e.g. "wg1 64x8 r40 s4"
    ALL = {**VARIANTS, **EXTRA}
    VARIANTS = {}
    for k in os.environ["PROBE_VARIANTS"].split(","):
        base, _, s = k.rpartition(" s")
        VARIANTS[k] = ALL[k] if k in ALL else {**ALL[base], "split": int(s)}


def forced_plan(arch, M, N, K, **kw):
    if FORCE[0] is None:
        return _plan(arch, M, N, K, **kw)
    if "auto_splits" in FORCE[0]:
        return {"path": "stream", **_WG, **op.stream_auto(N, K, kw["sms"], FORCE[0]["auto_splits"])}
    return {"path": "stream", **FORCE[0]}


op.plan = forced_plan


def measure(M: int, D: int, N: int, dev) -> dict:
    x, mods = module_copies(M, D, N, dev, L2_BYTES)
    fns = {
        "F.linear": [lambda m=m: F.linear(x, m.weight) for m in mods],
        "table": [flagged_call(m, x, FORCE, None, None) for m in mods],
    }
    for name, v in VARIANTS.items():
        fns[name] = [flagged_call(m, x, FORCE, v, None) for m in mods]
    outs = {k: v[0]().clone() for k, v in fns.items()}
    torch.cuda.synchronize()
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + EPS)
    ref = (xf * rstd[:, None] * mods[0].norm_weight.float()) @ mods[0].weight.float().t()
    plan = _plan(op.arch_key(dev), M, N, D, has_gemm=True, folded=True, sms=op.num_sms(dev))
    bad = {}
    for k in list(outs):  # a wrong variant is reported and left out, so the others still get timed
        e = ((outs[k].float() - ref).norm() / ref.norm()).item()
        if k != "F.linear" and not e <= 1e-2:
            bad[k] = e
            del outs[k], fns[k]
    if bad:
        print(f"M{M} D{D} N{N} WRONG (left out): {bad}", flush=True)
    row = checked_row(M, D, N, plan, fns, outs, ref, ROUNDS, {})
    row["wrong"] = bad
    return row


def main() -> int:
    out_dir, dev, ext, res = start(__doc__)
    with torch.no_grad():
        res["rows"] = [measure(M, D, N, dev) for M, D, N in SHAPES]
    return finish(
        out_dir, "probe_rmsnorm_stream", res, tag=lambda r: f"{r['plan'].get('path')} {r['plan'].get('config', '')}"
    )


if __name__ == "__main__":
    sys.exit(main())
