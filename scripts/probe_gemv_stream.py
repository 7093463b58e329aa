"""GPU probe: how close can a plain cp.async-pipelined decode kernel get to the weight-read floor at B16 N14336?

    python scripts/probe_gemv_stream.py OUTDIR

scripts/probe_read_layout.py (session 28) read the 14336 x 4096 bf16 weight with a Triton read-and-reduce kernel
(one program per 64 rows, no TMA) at 28.75-29.25 us, while F.linear at 16 tokens took 30.62 and the module's
config 11 ~31. This is the same kernel made into the whole op: per program 64 W' rows x all K, x's 16 tokens in
the same pipeline, tl.dot on tensor cores, sum of x^2 per token from the same tiles, rstd and the row scale in
the epilogue (one launch, no split). A prototype only (the package's kernels are CUDA C++): it says whether a
CUDA C++ kernel of this shape is worth writing. Variants over rows per program, k-block, warps and stages,
checked against the fp32 reference, timed against F.linear and the shipped module with weights rotated out of
L2 (CUDA graphs). Prints a table last.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[1]
sys.path += [str(d) for d in sorted((REPO / "packages").glob("*/src"))]


@triton.jit
def _gemv(w, x, y, N, K, eps, M, BN: tl.constexpr, BK: tl.constexpr, BM: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BN + tl.arange(0, BN)
    tok = tl.arange(0, BM)
    c = tl.arange(0, BK)
    acc = tl.zeros([BN, BM], tl.float32)
    ss = tl.zeros([BM], tl.float32)
    wp = w + rows.to(tl.int64)[:, None] * K + c[None, :]
    xp = x + tok[:, None] * K + c[None, :]
    for k in range(0, K, BK):
        wt = tl.load(wp + k)
        xt = tl.load(xp + k, mask=tok[:, None] < M, other=0.0)
        acc = tl.dot(wt, tl.trans(xt), acc)
        xf = xt.to(tl.float32)
        ss += tl.sum(xf * xf, axis=1)
    r = 1.0 / tl.sqrt(ss / K + eps)
    out = acc * r[None, :]
    tl.store(y + tok[None, :] * N + rows[:, None], out.to(y.dtype.element_ty), mask=tok[None, :] < M)


def gemv(x, wf, eps, BN, BK, warps, stages):
    M, K = x.shape
    N = wf.shape[0]
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    _gemv[(N // BN,)](wf, x, y, N, K, eps, M, BN=BN, BK=BK, BM=16, num_warps=warps, num_stages=stages)
    return y


def main() -> int:
    from fused_rmsnorm import FusedRMSNormLinear

    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    M, K, N, eps = 16, 4096, 14336, 1e-6
    x = torch.randn(M, K, device=dev).bfloat16()
    mods = []
    for _ in range(3):  # 3 x 117 MB of weights: past the 50 MB L2
        m = FusedRMSNormLinear(K, N, eps=eps, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            m.norm_weight.copy_((torch.rand(K, device=dev) + 0.5).bfloat16())
            m.weight.copy_((torch.randn(N, K, device=dev) / K**0.5).bfloat16())
        mods.append(m)
    from fused_rmsnorm.ops import rmsnorm_linear as op

    with torch.no_grad():
        wfs = [op.fold_weight(m.norm_weight, m.weight) for m in mods]
    xf, g0 = x.float(), mods[0].norm_weight.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * g0) @ mods[0].weight.float().t()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    res["cuda"] = torch.version.cuda
    variants = {}
    for BN in (64, 128):
        for BK in (128, 256):
            for warps, stages in ((4, 3), (4, 4), (8, 3), (8, 4)):
                smem = stages * (BN + 16) * BK * 2
                if smem > 200 * 1024:
                    continue
                variants[f"BN{BN} BK{BK} w{warps} s{stages}"] = (BN, BK, warps, stages)
    fns = {
        "F.linear": [lambda m=m: F.linear(x, m.weight) for m in mods],
        "module": [lambda m=m: m(x) for m in mods],
    }
    errs = {}
    with torch.no_grad():
        for name, v in variants.items():
            try:
                yv = gemv(x, wfs[0], eps, *v)
                torch.cuda.synchronize()
            except Exception as e:  # out of resources etc.
                print(f"{name}: {type(e).__name__} {str(e)[:120]}", flush=True)
                continue
            errs[name] = ((yv.float() - ref).norm() / ref.norm()).item()
            if errs[name] <= 1e-2:
                fns[name] = [lambda wf=wf, v=v: gemv(x, wf, eps, *v) for wf in wfs]
        errs["module"] = ((mods[0](x).float() - ref).norm() / ref.norm()).item()
        t = {k: [] for k in fns}
        for _ in range(3):  # interleaved rounds
            for k, fl in fns.items():
                it = [0]

                def many(fl=fl, it=it):
                    for _ in range(2 * len(fl)):
                        fl[it[0] % len(fl)]()
                        it[0] += 1

                t[k].append(triton.testing.do_bench_cudagraph(many, rep=100) / (2 * len(fl)) * 1e3)
    med = {k: statistics.median(v) for k, v in t.items()}
    res.update(rel_err=errs, us=t, median=med)
    (out_dir / "probe_gemv_stream.json").write_text(json.dumps(res, indent=1))
    fl = med["F.linear"]
    for k, v in sorted(med.items(), key=lambda kv: kv[1]):
        print(f"{k}: {v:.2f} us ({v / fl:.3f} F.linear), rel err {errs.get(k, 0):.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
