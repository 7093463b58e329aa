"""One call of an SM90 config alone (on a precomputed rstd, no PDL) per tile-scheduler knob, then F.linear, at
B4096 D4096 N4096 bf16, each in an NVTX range under "prof/" for Nsight Compute (fused-rmsnorm NOTES.md, Session 34):

    ncu --nvtx --nvtx-include "prof/" --clock-control none --print-nvtx-rename kernel --csv \\
      --metrics gpc__cycles_elapsed.max,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum \\
      python scripts/ncu_rmsnorm_sched.py [CONFIG ...] [--knobs rN,rM_s2,...]

Default: config 0 under every knob of VARIANTS.
"""

import argparse

import torch
import torch.nn.functional as F
from fused_rmsnorm import backend
from fused_rmsnorm.ops import rmsnorm_linear as op

# name -> (raster 1 along M | 2 along N, max swizzle, CTA cap or 0)
VARIANTS = {"rN": (2, 1, 0), "rM": (1, 1, 0), "rN_s2": (2, 2, 0), "rN_s4": (2, 4, 0), "rM_s2": (1, 2, 0),
            "rN_c128": (2, 1, 128), "rM_c128": (1, 1, 128)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("configs", nargs="*", type=int, default=[0])
    ap.add_argument("--knobs", default=",".join(VARIANTS))
    args = ap.parse_args()
    runs = {f"c{c}_{k}": (c, *VARIANTS[k]) for c in args.configs for k in args.knobs.split(",")}
    dev = torch.device("cuda")
    ext = backend.get_ext(dev).module
    M = D = N = 4096
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(M, D, device=dev, generator=g).bfloat16()
    w = (torch.randn(N, D, device=dev, generator=g) / 64).bfloat16()
    gn = (torch.rand(D, device=dev, generator=g) + 0.5).bfloat16()
    wf = op.fold_weight(gn, w)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
    out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream

    def gemm(config: int, raster: int, swizzle: int, ctas: int) -> None:
        # binding gemm_sm90(dtype 1 = bf16, config, a, lda, b, ldb, rstd, bias, d, ldd, M, N, K, pdl, stream,
        # raster, swizzle, splits, workspace, workspace bytes, eps, pdl_early, max_ctas)
        ext.gemm_sm90(1, config, x.data_ptr(), D, wf.data_ptr(), D, rstd.data_ptr(), 0, out.data_ptr(), N, M, N, D,
                      False, stream, raster, swizzle, 1, 0, 0, 1e-6, 0, ctas)  # fmt: skip

    for v in runs.values():  # warm-up outside the profiled range
        gemm(*v)
    F.linear(x, w)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prof")
    for name, v in runs.items():
        torch.cuda.nvtx.range_push(name)
        gemm(*v)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_push("flinear")
    F.linear(x, w)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    torch.cuda.nvtx.range_pop()
    print("done")


if __name__ == "__main__":
    main()
