"""Nsight Compute target: one profiled call of the SM90 attention forward per case, in the order given, inside
an NVTX push/pop range ``prof`` (warm-up calls outside it compile and settle the kernel first).

    ncu --nvtx --nvtx-include "prof/" --set full --import-source no -o REPORT \\
        python scripts/ncu_flash_fwd.py [--cases D128-N1024-full,D64-N1024-causal] [--overlay KEY=V+KEY2=V2]

Cases are the benchmark shapes (B*N = 16k tokens, H*D = 2048, bf16) with the shipped tuning-table config;
``--overlay`` sets SM90 keys on top (e.g. SM90_OTMA=0 against the table's SM90_OTMA=1) for an A/B pair of reports.
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
    ap.add_argument("--cases", default="D128-N1024-full,D64-N1024-causal")
    ap.add_argument("--overlay", default="", help="SM90 keys set on the shipped config, e.g. SM90_OTMA=0+SM90_LPT=8")
    args = ap.parse_args()
    over = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in filter(None, args.overlay.split("+"))}
    dev = torch.device("cuda")
    for case in args.cases.split(","):
        d, n, mode = case.split("-")
        D, N, causal = int(d[1:]), int(n[1:]), mode == "causal"
        B, H = 16384 // N, 2048 // D
        q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        cfg = dict(F.get_config("fwd", dev, D, causal, N, torch.bfloat16), **over)
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], device=dev, dtype=torch.float32)
        for _ in range(3):
            F._fwd_launch(q, k, v, out, lse, causal, D**-0.5, cfg)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("prof")  # ncu --nvtx-include "prof/" matches this push/pop range
        F._fwd_launch(q, k, v, out, lse, causal, D**-0.5, cfg)
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print(case, {kk: vv for kk, vv in cfg.items() if kk.startswith("SM90")}, flush=True)


if __name__ == "__main__":
    main()
