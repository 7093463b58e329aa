"""fused-rmsnorm benchmarks: Linear(RMSNorm(x)) fused vs F.linear alone and the unfused pair.

Shapes (the issue's table): decode B1/B8 D4096 N4096, B16 D4096 N14336; prefill B128 D8192 N8192,
B512 D4096 N4096, B1024 D2048 N2048, B4096 D4096 N4096. bf16. Every case is CUDA-graph timed
(small=True) with, in the same run:
* "F.linear" (anchor, the floor: the projection alone, no norm at all),
* "unfused" F.rms_norm + F.linear, "compiled" torch.compile of that pair,
* "fused" FusedRMSNormLinear (W' cached, as in a model), and "fused fn" (the functional API,
  which folds W' per call on the prefill path: shows what the cache saves).
bytes = the HBM floor W + x + y; flops = 2*M*N*D. ratio_vs_anchor > 1 means faster than F.linear.
Every impl rotates over several weight sets so that W streams from HBM on every call (results
committed before 2026-11-29 13:00 UTC were taken with one weight set: their records lack the
"weight sets rotated" note).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from .harness import Record, Suite, smoke_mode

try:
    import fused_rmsnorm
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "fused-rmsnorm" / "src"))
    import fused_rmsnorm

SHAPES = [  # (case, M, D, N)
    ("B1 D4096 N4096", 1, 4096, 4096),
    ("B8 D4096 N4096", 8, 4096, 4096),
    ("B16 D4096 N14336", 16, 4096, 14336),
    ("B128 D8192 N8192", 128, 8192, 8192),
    ("B512 D4096 N4096", 512, 4096, 4096),
    ("B1024 D2048 N2048", 1024, 2048, 2048),
    ("B4096 D4096 N4096", 4096, 4096, 4096),
]
QUICK = {"B1 D4096 N4096", "B16 D4096 N14336", "B1024 D2048 N2048", "B4096 D4096 N4096"}
SMOKE = [("smoke B2 D64 N48", 2, 64, 48), ("smoke B40 D64 N48", 40, 64, 48)]


L2_BYTES = 60 * 2**20  # H200 (50 MB on the datasheet; rounded up so rotation always clears it)


def _case(suite: Suite, case: str, M: int, D: int, N: int, device, dtype, compile_pair: bool) -> None:
    eps = 1e-6
    x = torch.randn(M, D, device=device, dtype=dtype)
    # Several weight sets, rotated call to call (see harness.time_ms): a decode step reads W from
    # HBM, so no impl may find it in L2 from the previous call (a 32 MB W otherwise half fits).
    w_bytes = N * D * x.element_size()
    n_sets = 1 if smoke_mode() else max(2, min(8, -(-2 * L2_BYTES // w_bytes)))
    sets = []
    for _ in range(n_sets):
        g = (torch.rand(D, device=device) + 0.5).to(dtype)
        w = (torch.randn(N, D, device=device) / D**0.5).to(dtype)
        mod = fused_rmsnorm.FusedRMSNormLinear(D, N, eps=eps, device=device, dtype=dtype)
        with torch.no_grad():
            mod.weight.copy_(w)
            mod.norm_weight.copy_(g)
        sets.append((g, w, mod))

    def unfused(x, g, w):
        return F.linear(F.rms_norm(x, (D,), g, eps), w)

    impls = {
        "F.linear": [lambda w=w: F.linear(x, w) for _, w, _ in sets],
        "unfused": [lambda g=g, w=w: unfused(x, g, w) for g, w, _ in sets],
        "fused": [lambda mod=mod: mod(x) for _, _, mod in sets],
        "fused fn": [lambda g=g, w=w: fused_rmsnorm.fused_rmsnorm_linear(x, g, w, eps=eps) for g, w, _ in sets],
    }
    if compile_pair:
        compiled = torch.compile(unfused)  # one compile: the weights are arguments, not closures
        impls["compiled"] = [lambda g=g, w=w: compiled(x, g, w) for g, w, _ in sets]
    with torch.no_grad():
        for fns in impls.values():  # resolve the backend (may JIT-compile), fill the fold caches and
            for f in fns:  # compile outside the CUDA-graph capture
                f()
        suite.compare(
            case,
            {"M": M, "D": D, "N": N, "dtype": str(dtype).replace("torch.", "")},
            impls,
            anchor="F.linear",
            flops=2.0 * M * N * D,
            bytes=float((N * D + M * D + M * N) * x.element_size()),
            small=True,
            note=f"backend {fused_rmsnorm.backend_info().get('prefill' if M > 16 else 'decode')}; "
            f"{n_sets} weight sets rotated (no L2 reuse across calls)",
        )


def run(quick: bool = False, progress=None) -> list[Record]:
    suite = Suite("rmsnorm", progress=progress)
    if smoke_mode():
        for case, M, D, N in SMOKE:  # CPU: the PyTorch path; proves the wiring only
            _case(suite, case, M, D, N, torch.device("cpu"), torch.float32, compile_pair=False)
        return suite.records
    device = torch.device("cuda")
    for case, M, D, N in SHAPES:
        if quick and case not in QUICK:
            continue
        _case(suite, case, M, D, N, device, torch.bfloat16, compile_pair=True)
    return suite.records


if __name__ == "__main__":
    from .harness import RESULTS_DIR, gpu_slug, markdown_table, write_results

    recs = run(quick="--quick" in sys.argv)
    print(markdown_table(recs))
    print(write_results(recs, RESULTS_DIR / f"rmsnorm-{gpu_slug()}.json"))
