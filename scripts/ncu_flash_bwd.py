"""Nsight Compute target: one profiled attention backward per case, in the order given, inside an NVTX push/pop
range ``prof`` (warm-up calls outside it compile and settle the kernels first).

    ncu --nvtx --nvtx-include "prof/" --set full --import-source no -o REPORT \\
        python scripts/ncu_flash_bwd.py [--cases bwd-D128-N16384-causal,bwd-D128-N16384-full] [--overlay KEY=V+KEY2=V2]

Cases are the benchmark shapes (B*N = 16k tokens, H*D = 2048, bf16) with the shipped bwd tuning-table config
(preprocess, dK/dV and dQ launches, or one fused launch); ``--overlay`` sets keys on top of it (e.g. TMA=1).
``scripts/ncu_source_report.py`` summarises the report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages/flashattn-triton/src"))

import torch  # noqa: E402
from flashattn_triton.ops import flash_attn as F  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="bwd-D128-N16384-causal,bwd-D128-N16384-full")
    ap.add_argument("--overlay", default="", help="bwd config keys set on the shipped config, e.g. TMA=1+LPT=4")
    args = ap.parse_args()
    over = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in filter(None, args.overlay.split("+"))}
    dev = torch.device("cuda")
    for case in args.cases.split(","):
        _, d, n, mode = case.split("-")
        D, N, causal = int(d[1:]), int(n[1:]), mode == "causal"
        B, H = 16384 // N, 2048 // D
        q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
        scale = D**-0.5
        out, lse = F._forward_impl(q, k, v, causal, scale)
        cfg = dict(F.get_config("bwd", dev, D, causal, N, torch.bfloat16), **over)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def step():
            F._backward_launch(do, q, k, v, out, lse, None, dq, dk, dv, causal, scale, cfg)  # noqa: B023

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("prof")  # ncu --nvtx-include "prof/" matches this push/pop range
        step()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(case, cfg, flush=True)


if __name__ == "__main__":
    main()
