"""int8-gemm benchmarks: W8A8 GEMM with fused dequant vs torch._int_mm and cuBLAS fp16/bf16.

Suites (TOPS = 2*M*N*K / time, for every impl):
* int8-square: M=N=K 1024/2048/4096/8192; ours (fused dequant, K-major B) vs torch._int_mm raw,
  _int_mm + torch dequant, fp16 and bf16 cuBLAS (torch.matmul). Anchor: bf16 cuBLAS.
* int8-seed: the seed's table, M=N=K 1024/2048/4096 vs fp16 cuBLAS (anchor).
* int8-llm: M in {1,16,32,128,1024,4096} x (N,K) in {(4096,4096),(14336,4096),(4096,14336)}:
  the GEMM alone (pre-quantized x) and Int8Linear end to end (activation quantization included)
  vs bf16 F.linear (anchor).
Cases whose kernels take well under ~0.2 ms (2*M*N*K <= GRAPH_MAX_FLOPS) are timed by CUDA-graph
replay: plain timing there measures the ~30-70 us of Python/Triton launch work per call, which a
serving loop hides in a graph (scripts/probe_int8.py reports that host cost separately).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from .harness import Record, Suite, smoke_mode

try:
    import int8_gemm
except ImportError:  # running from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "int8-gemm" / "src"))
    import int8_gemm


GRAPH_MAX_FLOPS = 1.3e11  # ~0.1-0.2 ms of int8 or bf16 tensor-core work on an H200


def _i8(*shape, device):
    return torch.randint(-127, 128, shape, dtype=torch.int8, device=device)


def _square(suite: Suite, sizes, device, seed_table: bool) -> None:
    for s in sizes:
        _square_case(suite, s, device, seed_table)


def _square_case(suite: Suite, s: int, device, seed_table: bool) -> None:
    M = N = K = s
    a, w = _i8(M, K, device=device), _i8(N, K, device=device)
    b = w.t()  # K-major: the fast layout (cuBLAS int8 also wants it: _int_mm's "TN")
    sa = torch.rand(M, device=device) * 1e-3 + 1e-4  # realistic: no fp16 overflow
    sb = torch.rand(N, device=device) * 1e-3 + 1e-4
    x16, w16 = (
        torch.randn(M, K, device=device, dtype=torch.float16),
        torch.randn(K, N, device=device, dtype=torch.float16),
    )
    xb, wb = x16.bfloat16(), w16.bfloat16()
    ours = lambda: int8_gemm.int8_gemm_dequant_fwd(a, b, sa, sb, out_dtype=torch.float16)
    impls = {"int8_gemm fused dequant": ours, "cublas fp16": lambda: torch.matmul(x16, w16)}
    if not seed_table:
        impls |= {
            "cublas bf16": lambda: torch.matmul(xb, wb),
            "torch._int_mm raw": lambda: torch._int_mm(a, b),
            "torch._int_mm + dequant": lambda: (torch._int_mm(a, b).float() * sa[:, None] * sb[None, :]).half(),
        }
    suite.compare(
        f"{M}x{N}x{K}",
        dict(M=M, N=N, K=K),
        impls,
        anchor="cublas fp16" if seed_table else "cublas bf16",
        flops=2.0 * M * N * K,
        bytes=float(M * K + K * N + 2 * M * N),
        small=2.0 * M * N * K <= GRAPH_MAX_FLOPS,
    )


def _llm(suite: Suite, ms, nks, device) -> None:
    for N, K in nks:
        _llm_weight(suite, ms, N, K, device)


L2_BYTES = 60 * 2**20  # H200


def _llm_weight(suite: Suite, ms, N: int, K: int, device) -> None:
    # Several weight copies, rotated call to call (graph replay included, see harness.time_ms),
    # so the weight streams from HBM as in a real model instead of sitting in the 60 MB L2.
    n_sets = 1 if smoke_mode() else max(2, min(8, -(-2 * L2_BYTES // (N * K))))
    sets = []
    for _ in range(n_sets):
        w = torch.randn(N, K, device=device, dtype=torch.bfloat16) * 0.02
        lin = torch.nn.Linear(K, N, bias=False, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(w)
        sets.append((w, int8_gemm.Int8Linear.from_float(lin)))
    for M in ms:
        _llm_case(suite, M, N, K, sets, device)


def _with_fused_quant_bytes(limit: int, qlin, x):
    """Run qlin(x) with int8_linear's fused-quantization threshold forced (Python-level switch,
    so a CUDA graph captures the chosen path)."""
    from int8_gemm.ops import linear as lmod

    old = lmod.FUSED_QUANT_MAX_BYTES
    lmod.FUSED_QUANT_MAX_BYTES = limit
    try:
        return qlin(x)
    finally:
        lmod.FUSED_QUANT_MAX_BYTES = old


def _llm_case(suite: Suite, M: int, N: int, K: int, sets, device) -> None:
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
    x_q, sa = int8_gemm.quantize_symmetric(x)
    bf16, gemm, e2e, two_k, fused_q, int_mm = [], [], [], [], [], []
    for w, qlin in sets:
        wt, ws = qlin.weight.t(), qlin.weight_scale
        bf16.append(lambda w=w: F.linear(x, w))
        gemm.append(lambda wt=wt, ws=ws: int8_gemm.int8_gemm_dequant_fwd(x_q, wt, sa, ws, out_dtype=torch.bfloat16))
        e2e.append(lambda qlin=qlin: qlin(x))
        two_k.append(lambda qlin=qlin: _with_fused_quant_bytes(0, qlin, x))
        fused_q.append(lambda qlin=qlin: _with_fused_quant_bytes(1 << 40, qlin, x))
        int_mm.append(lambda wt=wt: torch._int_mm(x_q, wt))
    impls = {"bf16 F.linear": bf16, "int8_gemm (pre-quantized x)": gemm, "Int8Linear e2e": e2e}
    if M <= 16:  # both decode variants, to check the FUSED_QUANT_MAX_BYTES switch point
        impls["Int8Linear e2e [quant kernel + GEMM]"] = two_k
        impls["Int8Linear e2e [quant fused in GEMM]"] = fused_q
    if M > 16 and not smoke_mode():
        impls["torch._int_mm raw"] = int_mm
    suite.compare(
        f"M{M} N{N} K{K}",
        dict(M=M, N=N, K=K),
        impls,
        anchor="bf16 F.linear",
        flops=2.0 * M * N * K,
        bytes=float(M * K + N * K + 2 * M * N),  # int8 operands; bf16 anchor moves 2x the weight
        small=2.0 * M * N * K <= GRAPH_MAX_FLOPS,
        note=f"{len(sets)} weight copies rotated (no L2 reuse across calls)",
    )


def run(quick: bool = False, progress=None) -> list[Record]:
    smoke = smoke_mode()
    device = "cpu" if smoke else "cuda"
    torch.manual_seed(0)
    square = Suite("int8-square", progress=progress)
    seed = Suite("int8-seed", progress=progress)
    llm = Suite("int8-llm", progress=progress)
    if smoke:
        # Interpreter: seconds, not minutes. fp16/bf16 CPU matmuls stand in for cuBLAS.
        _square(square, [48], device, seed_table=False)
        _square(seed, [32], device, seed_table=True)
        _llm(llm, [1, 20], [(48, 64)], device)
    else:
        _square(square, [2048, 4096, 8192] if quick else [1024, 2048, 4096, 8192], device, seed_table=False)
        _square(seed, [1024, 2048, 4096], device, seed_table=True)
        ms = [1, 16, 128, 4096] if quick else [1, 16, 32, 128, 1024, 4096]
        nks = [(4096, 4096), (14336, 4096)] if quick else [(4096, 4096), (14336, 4096), (4096, 14336)]
        _llm(llm, ms, nks, device)
    return square.records + seed.records + llm.records
