"""H200 probe: PDL across Int8Linear decode calls (ops/linear.py PDL_CHAIN).

    python scripts/probe_int8_pdl_chain.py OUTDIR [--rounds 3]

Modes: chain 0 (shipped before: only the GEMM is a programmatic dependent, of the quantizer), 1 (the
quantizer / fused GEMV is a PDL launch too and waits for the kernel before it; the GEMM triggers the next
launch after its main loop), 2 (the GEMM triggers at its start). Two contexts, CUDA-graph timed with the
benchmark's weight rotation (benchmarks/harness.time_ms small=True, so calls run back to back in a graph):
"b2b" = Int8Linear calls back to back (the benchmark suite's setting), "after_op" = every call preceded by
an elementwise kernel writing its x (a residual add stand-in; F.linear gets the same kernel). Rounds are
interleaved (round-robin over modes). Every mode is first checked bit-identical to chain 0.
Writes OUTDIR/probe_int8_pdl_chain.json; prints a table last.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import int8_gemm  # noqa: E402
from int8_gemm.ops import linear as lmod  # noqa: E402

from benchmarks.harness import time_ms  # noqa: E402

L2_BYTES = 60 * 2**20
SHAPES = [(m, n, k) for m in (1, 8, 16) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]


def with_chain(chain, fn):
    def call():
        old = lmod.PDL_CHAIN
        lmod.PDL_CHAIN = chain
        try:
            return fn()
        finally:
            lmod.PDL_CHAIN = old

    return call


def _row(M: int, N: int, K: int, rounds: int, dev) -> dict:
    torch.manual_seed(M * 7 + N + K)
    n_sets = max(2, min(8, -(-2 * L2_BYTES // (N * K))))
    sets = []
    for _ in range(n_sets):
        lin = torch.nn.Linear(K, N, bias=False, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(N, K, device=dev) * 0.02)
        sets.append((lin.weight.detach(), int8_gemm.Int8Linear.from_float(lin)))
    src = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    x = src.clone()
    ref = [q(x) for _, q in sets]
    for chain in (1, 2):
        for (_, q), r in zip(sets, ref):
            assert torch.equal(with_chain(chain, lambda q=q: q(x))(), r), f"chain {chain} differs at {(M, N, K)}"

    def write_x():
        torch.add(src, 0.0, out=x)

    def nothing():
        pass

    fns = {}
    for ctx, pre in (("b2b", nothing), ("after_op", write_x)):
        fns[f"{ctx} F.linear"] = [lambda w=w, pre=pre: (pre(), F.linear(x, w)) for w, _ in sets]
        for chain in (0, 1, 2):
            fns[f"{ctx} chain{chain}"] = [with_chain(chain, lambda q=q, pre=pre: (pre(), q(x))) for _, q in sets]
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            times[k].append(time_ms(f, small=True) * 1e3)
    row = {k: statistics.median(v) for k, v in times.items()}
    row["all"] = times
    return row


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    dev = torch.device("cuda")
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": {}}
    for M, N, K in SHAPES:
        row = res["rows"][f"M{M} N{N} K{K}"] = _row(M, N, K, rounds, dev)
        print(f"M{M} N{N} K{K}: " + " ".join(f"{k}={v:.2f}" for k, v in row.items() if k != "all"), flush=True)
    (out / "probe_int8_pdl_chain.json").write_text(json.dumps(res, indent=1))
    print("\nus (median of rounds); ratio = F.linear / ours, same context")
    print(f"{'shape':<20}{'ctx':<10}{'F.lin':>8}{'c0':>8}{'c1':>8}{'c2':>8}{'r0':>7}{'r1':>7}{'r2':>7}")
    for name, row in res["rows"].items():
        for ctx in ("b2b", "after_op"):
            fl = row[f"{ctx} F.linear"]
            c = [row[f"{ctx} chain{i}"] for i in range(3)]
            rs = "".join(f"{fl / t:7.3f}" for t in c)
            print(f"{name:<20}{ctx:<10}{fl:8.2f}" + "".join(f"{t:8.2f}" for t in c) + rs)


if __name__ == "__main__":
    main()
