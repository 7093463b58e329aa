"""GPU probe: the prefill GEMM as CUTLASS's non-persistent warp-specialized kernel (configs 12-14), and other
forced tile configs on the module path.

    python scripts/probe_rmsnorm_basic.py OUTDIR     (needs a build with FRMS_SM90_NUM_CONFIGS >= 15)
    PROBE_BASIC_SET=<set> python scripts/probe_rmsnorm_basic.py OUTDIR     (other shape sets, SETS below: wide, odd,
    mid, mid2 .. mid5, llm, wave, big, big2, big3, big4, big5, big6, big7, big8,
    big9)
    PROBE_ROUNDS=<n> (interleaved rounds, default 3); PROBE_BASIC_X=randn (the suite's randn x instead of rows
    scaled apart)

The shipped prefill configs are CUTLASS's persistent kernels: 384 threads x 168 registers, the whole register
file. So under PDL a GEMM CTA starts on an SM only once the rstd CTA there retires, and the rstd kernel's
latency sits in front of every tile. CUTLASS's non-persistent `KernelTmaWarpSpecialized` runs one producer and
one consumer warpgroup (256 threads x 154 registers, ~193 KB of shared memory for the 128x128 tile): an 8-warp
rstd CTA (48 registers) fits beside it, so the GEMM can start everywhere at once. At one tile per CTA it does
the same work as ping-pong config 1, whose second consumer warpgroup then idles. Configs: 12 = 128x128,
13 = 128x128 with a 2-CTA cluster along M, 14 = 64x128 with a 2-CTA cluster.

Checks each variant's output against an fp32 reference, then times interleaved rounds: F.linear, the shipped
module path, the module path forced onto the shape's configs (an int, or a dict of gemm keys such as
{"config": 0, "swizzle": 8}), and the GEMMs alone on a precomputed rstd (CUDA graphs, weight sets rotated out
of L2). Prints a table last.
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
from rmsnorm_probe_cases import checked_row, finish, flagged_call, module_copies, start  # noqa: E402

SHAPES = [  # (M, D, N, configs forced on the module path)
    (1024, 2048, 2048, (1, 12, 13)),
    (512, 4096, 4096, (1, 12, 13)),
    (128, 8192, 8192, (14,)),
    (256, 4096, 4096, (12, 14)),
    (300, 5120, 5120, (12, 14)),
    (2048, 2048, 2048, (12,)),
    (1024, 4096, 4096, (12,)),
]
# one-wave grids off the suite (100-132 tiles of 128x128 at M >= 257, where the table's default is a persistent
# config) and two controls (96 tiles; 128 tiles at small K): does config 12 win there as well?
WIDE = [
    (2048, 4096, 1024, (12, 13)),
    (768, 2048, 2816, (12, 13)),
    (640, 8192, 3072, (12, 13)),
    (1024, 4096, 1792, (12, 13)),
    (4096, 1024, 512, (12, 13)),
    (512, 14336, 4096, (12, 13)),
    (1000, 2048, 2048, (1, 12)),
    (300, 5120, 5120, (12,)),
    (384, 4096, 4096, (12, 13)),
    (2048, 512, 1024, (12, 13)),
]
# cluster-2-along-M configs at odd row-tile counts (the 4096^2 entry's config 4 took 34.5 us at M384 in the wide
# set, config 12 24.9), and two more one-wave grids
ODD = [
    (384, 4096, 4096, (4, 1, 12, 0)),
    (640, 4096, 4096, (4, 1, 12)),
    (896, 4096, 4096, (4, 1, 12)),
    (768, 4096, 4096, (4, 1)),
    (1152, 4096, 4096, (0, 1)),
    (3968, 4096, 4096, (0, 1)),
    (1536, 2048, 1280, (1, 12)),
    (896, 3072, 2048, (1, 12)),
]
# 4096^2 at M 1153..4095, where session 4's entry (config 0 with swizzle 8) was measured near M1024 only: in session
# 24's first run config 1 took 84.5 us at M1536 against 103.4 for the table (F.linear 80.6)
C0S8 = {"config": 0, "swizzle": 8}
MID = [(m, 4096, 4096, (C0S8, 1)) for m in (1280, 1536, 1792, 2304, 2560, 2816, 3072, 3328, 3584, 3840)]
# the same question where the table's MN rule sends M >= 2049 (N14336) / M >= 1024 (8192^2) to config 0
MID2 = [(m, 4096, 14336, (0, 1)) for m in (2304, 2816, 3328, 3840)]
MID2 += [(m, 8192, 8192, (0, 1)) for m in (640, 1152, 1536, 2304, 3328)]
# the rows still >= 1.09x F.linear after those two sets: other tiles, stream-K (6) and scheduler knobs
C1S2, C1R1 = {"config": 1, "swizzle": 2}, {"config": 1, "raster": 1}
MID3 = [(m, 4096, 4096, (1, 6, 4, C1S2, C1R1)) for m in (1280, 2304, 2816, 3328)]
MID3 += [(m, 8192, 8192, (0, 1, 6, 4, 5)) for m in (640, 1152, 2304)]
# stream-K (6) won at 8192^2 M640 / M1152 in mid3: the row counts around them
MID4 = [(m, 8192, 8192, (6,)) for m in (768, 896, 1024, 1280, 1408, 1536)]
# a confirming run of the stream-K entries against the configs the table gave before
MID5 = [(640, 8192, 8192, (1,)), (896, 8192, 8192, (1,)), (1152, 8192, 8192, (0,))]
# model projections after a norm (Llama-3 8B / 70B qkv and gate+up) at mid row counts: configs 0, 1, stream-K
# (run in session 25: config 1 won at D4096 N6144, hence the WAVE_C1 rule)
LLM = [(m, d, n, (0, 1, 6)) for d, n in ((4096, 6144), (4096, 28672), (8192, 10240), (8192, 28672))
       for m in (1536, 2304)]  # fmt: skip
# session 25: the rounds model's default (WAVE_C1) at shapes it sends to config 1 (1024 x 10240, 2304 x 6144,
# 1536 x 6144, 1280 x 8192) or keeps on config 0
WAVE = [(m, d, n, (0, 1)) for m, d, n in ((1024, 4096, 10240), (2304, 5120, 6144), (1536, 8192, 6144),
                                          (2048, 4096, 6144), (3072, 5120, 5120), (1280, 8192, 8192))]  # fmt: skip
# session 26 (written then, run in session 27): B4096 sits at the prefill bar; config 0's swizzle and the
# 256x128 tile (5) at M4096, with config 0 alone on a precomputed rstd for the GEMM's own share
BIG = [(4096, d, n, (0, 5, {"config": 0, "swizzle": 2}, {"config": 0, "swizzle": 4}, {"config": 5, "swizzle": 2}))
       for d, n in ((4096, 4096), (8192, 8192))]  # fmt: skip
# session 27: in "big" (one run) swizzle 4 took config 0 at M4096 8192^2 from 861.9 to 843.3 us (F.linear 831.0) but
# lost at 4096^2 (220.8 vs 217.4): row counts around it, and the Llama gate+up width
C0S4 = {"config": 0, "swizzle": 4}
BIG2 = [(m, 8192, 8192, (0, C0S4, C0S8)) for m in (3584, 4096, 4608)]
BIG2 += [(4096, 4096, 14336, (0, C0S4)), (4096, 4096, 4096, (0, C0S4))]
# the confirming run on the table that took it (M 3969..4096 at 8192^2): the shipped path against config 0 forced
BIG3 = [(m, 8192, 8192, (0,)) for m in (4000, 4096)]
# session 33: at B4096 how much of the module's time over F.linear is the rstd pass (streamed vs in front, raster
# along M) and how much the GEMM (alone on a precomputed rstd); PROBE_BASIC_X=randn times the suite's x instead
# ... and config 15, rstd summed in K slices by the GEMM's own tiles (slices 8 by default; 4, 16; on 128 CTAs).
# big4 / big5 need the probe build of benchmarks/results/probes/h200-probe_rmsnorm_split_rstd.patch (not shipped)
C15 = (15, {"config": 15, "slices": 4}, {"config": 15, "slices": 16}, {"config": 15, "ctas": 128})
BIG4 = [(4096, 4096, 4096, (0, {"config": 0, "raster": 1}, *C15)), (4096, 4096, 14336, (0, 15)),
        (4096, 8192, 8192, (0, 15)), (2048, 4096, 4096, (0, 1, 15)), (8192, 4096, 4096, (0, 15))]  # fmt: skip
# the confirming run at B4096 alone, more rounds: the shipped (streamed) path against config 15 on 128 and 132 CTAs
BIG5 = [(4096, 4096, 4096, (0, 15, {"config": 15, "ctas": 128}))]
# session 34: the swapped 256x128 cooperative tile (config 15, cuBLAS's own form at B4096) and the 64x256 ping-pong
# tiles (16 with a 2-CTA cluster, 17 without: one warpgroup's epilogue under the other's mainloop) against the
# table, on the module path (streamed rstd where it applies) and alone on a precomputed rstd. big6 / big7 need the
# probe build of benchmarks/results/probes/h200-probe_rmsnorm_swap_pingpong_tiles.patch (not shipped); when big6
# ran, config 16 was config 15 with its cluster along the W' rows instead
C15R = {"config": 15, "raster": 1}  # the heuristic's order at B4096; explicit where the heuristic would pick N
BIG6 = [(4096, 4096, 4096, (0, 15, 16, {"config": 15, "swizzle": 2})), (8192, 4096, 4096, (0, 15, 16)),
        (4096, 4096, 14336, (0, 15, C15R)), (4096, 8192, 8192, (0, 15, C15R)), (2048, 4096, 4096, (1, 15, 16)),
        (1024, 2048, 2048, (15,)), (512, 4096, 4096, (15,)), (4096, 2048, 2048, (0, 15))]  # fmt: skip
BIG7 = [(4096, 4096, 4096, (0, 16, 17, {"config": 16, "swizzle": 2})), (8192, 4096, 4096, (0, 16, 17)),
        (4096, 4096, 14336, (0, 16)), (4096, 8192, 8192, (0, 16, {"config": 16, "swizzle": 4})),
        (2048, 4096, 4096, (1, 16)), (4096, 2048, 2048, (0, 16))]  # fmt: skip
# ... then config 0 with L2 cache hints on its TMA loads (15: W' evict_last; 16: also x evict_first), which need
# the probe build of benchmarks/results/probes/h200-probe_rmsnorm_l2_hints.patch (not shipped)
BIG8 = [(4096, 4096, 4096, (0, 15, 16)), (8192, 4096, 4096, (0, 15, 16)), (4096, 4096, 14336, (0, 15, 16)),
        (4096, 8192, 8192, (0, 15, {"config": 15, "swizzle": 4}, {"config": 16, "swizzle": 4})),
        (2048, 4096, 4096, (C0S8, {"config": 15, "swizzle": 8})), (4096, 2048, 2048, (0, 15, 16))]  # fmt: skip
# ... then config 0 in 4-CTA clusters (15: 2x2, x multicast along N too; 16: 4x1, W' to 4 M tiles), which need the
# probe build of benchmarks/results/probes/h200-probe_rmsnorm_cluster4.patch (not shipped)
BIG9 = [(4096, 4096, 4096, (0, 15, 16)), (8192, 4096, 4096, (0, 15, 16)), (4096, 4096, 14336, (0, 15, 16)),
        (4096, 8192, 8192, ({"config": 0, "swizzle": 4}, 15, {"config": 15, "swizzle": 4}, 16)),
        (2048, 4096, 4096, (C0S8, 15, 16)), (4096, 2048, 2048, (0, 15, 16))]  # fmt: skip
SETS = {
    "suite": SHAPES, "wide": WIDE, "odd": ODD, "mid": MID, "mid2": MID2, "mid3": MID3, "mid4": MID4, "mid5": MID5,
    "llm": LLM, "wave": WAVE, "big": BIG, "big2": BIG2, "big3": BIG3, "big4": BIG4, "big5": BIG5,
    "big6": BIG6, "big7": BIG7, "big8": BIG8, "big9": BIG9,
}  # fmt: skip
ALONE = (0, 1, 12, 15, 16, 17)  # GEMM alone on a precomputed rstd (no PDL), where the shape's forced list has them
ROUNDS = int(os.environ.get("PROBE_ROUNDS", "3"))
L2_BYTES = 60 * 2**20
EPS = 1e-6
_plan = op.plan
FORCE: list = [None]


def forced_plan(arch, M, N, K, **kw):
    if FORCE[0] is None:
        return _plan(arch, M, N, K, **kw)
    forced = FORCE[0] if isinstance(FORCE[0], dict) else {"config": FORCE[0]}
    return {"path": "gemm", "pdl": True, **forced}


def label(c) -> str:
    """c12, or c0s8 for {"config": 0, "swizzle": 8}"""
    if not isinstance(c, dict):
        return f"c{c}"
    return f"c{c['config']}" + "".join(f"{k[0]}{v}" for k, v in c.items() if k != "config")


op.plan = forced_plan


def measure(M: int, D: int, N: int, forced, dev, ext) -> dict:
    x, mods = module_copies(M, D, N, dev, L2_BYTES)
    if os.environ.get("PROBE_BASIC_X") == "randn":  # the suite's data (the probes' rows scaled apart draw other power)
        x = torch.randn(M, D, device=dev, generator=torch.Generator(device=dev).manual_seed(M)).bfloat16()

    def module(m, cfg):
        return flagged_call(m, x, FORCE, cfg, None)

    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
    wfs = [op.fold_weight(m.norm_weight, m.weight) for m in mods]

    def alone(wf, cfg):
        out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)

        def run():  # the stream at call time: the timer captures its CUDA graphs on a side stream
            stream = torch.cuda.current_stream().cuda_stream
            ext.module.gemm_sm90(
                1, cfg, x.data_ptr(), x.stride(0), wf.data_ptr(), wf.stride(0), rstd.data_ptr(), 0,
                out.data_ptr(), out.stride(0), M, N, D, False, stream, 0, 1, 1, 0, 0, EPS, 0,
            )  # fmt: skip
            return out

        return run

    fns = {"F.linear": [lambda m=m: F.linear(x, m.weight) for m in mods], "module": [module(m, None) for m in mods]}
    for c in forced:
        fns[f"module {label(c)}"] = [module(m, c) for m in mods]
    for c in ALONE:
        if c in forced:
            fns[f"alone c{c}"] = [alone(wf, c) for wf in wfs]
    outs = {k: v[0]().clone() for k, v in fns.items()}
    torch.cuda.synchronize()
    xf = x.float()
    ref = (xf * rstd[:, None] * mods[0].norm_weight.float()) @ mods[0].weight.float().t()
    # another tile or kernel may round differently: compared with the reference only, the bits just recorded
    row = checked_row(M, D, N, _plan(op.arch_key(dev), M, N, D, has_gemm=True), fns, outs, ref, ROUNDS, {})
    row["same_bits_as_module"] = {
        k: bool(torch.equal(o, outs["module"])) for k, o in outs.items() if k not in ("F.linear", "module")
    }
    return row


def main() -> int:
    out_dir, dev, ext, res = start(__doc__)
    if ext.module.num_sm90_configs() < 15:
        raise SystemExit("this build has no configs 12-14")
    with torch.no_grad():
        shapes = SETS[os.environ.get("PROBE_BASIC_SET", "suite")]
        res["rows"] = [measure(M, D, N, f, dev, ext) for M, D, N, f in shapes]
    return finish(out_dir, "probe_rmsnorm_basic", res)


if __name__ == "__main__":
    sys.exit(main())
