"""GPU probe: does the weight's memory layout change how fast a decode GEMV can stream it?

    python scripts/probe_read_layout.py OUTDIR

The decode GEMMs (ours and cuBLAS's) read W (N x K, row-major) as 64-row boxes: each k-step touches 64 rows
8 KB apart, 256 B in each. The modules own their W' = W * g copy, so W' could be stored pre-tiled instead,
each box one contiguous 16 KB. This times a read-and-reduce Triton kernel over the 14336 x 4096 bf16 weight of
B16 D4096 N14336 in both layouts (same grid, same loads per program), with weight copies rotated out of L2 and
CUDA-graph timing, against F.linear on 16 tokens of the same W. Prints a table last.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _read(w, out, K, R: tl.constexpr, BK: tl.constexpr, TILED: tl.constexpr, SPLIT: tl.constexpr):
    pid = tl.program_id(0)
    tile = pid // SPLIT
    part = pid % SPLIT
    r = tl.arange(0, R)
    c = tl.arange(0, BK)
    acc = tl.zeros([R, BK], tl.float32)
    kp = K // SPLIT
    for k in range(part * kp, part * kp + kp, BK):
        if TILED:  # [N / R][K / BK][R][BK]: one box is R * BK contiguous elements
            offs = tile.to(tl.int64) * R * K + k * R + r[:, None] * BK + c[None, :]
        else:  # row-major (N, K)
            offs = (tile.to(tl.int64) * R + r[:, None]) * K + k + c[None, :]
        acc += tl.load(w + offs).to(tl.float32)
    tl.store(out + pid, tl.sum(acc))


def main() -> int:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    N, K, M = 14336, 4096, 16
    copies = [torch.randn(N, K, device=dev).bfloat16() for _ in range(3)]  # 3 x 117 MB: past the 50 MB L2
    x = torch.randn(M, K, device=dev).bfloat16()
    nbytes = N * K * 2
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    res["cuda"] = torch.version.cuda
    rows = {}

    def timed(name, fns):
        it = iter(range(10**9))

        def step():
            fns[next(it) % len(fns)]()

        # several calls per graph so the rotation runs inside it
        def many():
            for _ in range(len(fns) * 2):
                step()

        ms = triton.testing.do_bench_cudagraph(many, rep=200) / (len(fns) * 2)
        rows[name] = {"us": ms * 1e3, "TB/s": nbytes / ms / 1e9}
        print(f"{name}: {ms * 1e3:.2f} us, {nbytes / ms / 1e9:.2f} TB/s", flush=True)

    timed("F.linear M16", [lambda w=w: F.linear(x, w) for w in copies])
    for R, BK in ((64, 128), (64, 256)):
        for split in (1, 2):
            for tiled in (False, True):
                grid = (N // R * split,)
                out = torch.empty(grid[0], device=dev)
                for warps, stages in ((4, 4), (8, 3)):

                    def run(w, R=R, BK=BK, tiled=tiled, split=split, warps=warps, stages=stages, grid=grid, out=out):
                        _read[grid](w, out, K, R=R, BK=BK, TILED=tiled, SPLIT=split, num_warps=warps,
                                    num_stages=stages)  # fmt: skip

                    # the same bytes either way: the tiled layout is only a different address map
                    name = f"{'tiled' if tiled else 'rows '} R{R} BK{BK} split{split} w{warps} s{stages}"
                    timed(name, [lambda w=w, run=run: run(w) for w in copies])
    res["rows"] = rows
    (out_dir / "probe_read_layout.json").write_text(json.dumps(res, indent=1))
    best = {lay: min((v["us"], k) for k, v in rows.items() if k.startswith(lay)) for lay in ("rows", "tiled")}
    print(f"best rows {best['rows'][0]:.2f} ({best['rows'][1]}), best tiled {best['tiled'][0]:.2f} "
          f"({best['tiled'][1]}), F.linear {rows['F.linear M16']['us']:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
