"""Offline (no GPU) register / spill check of the flash backward kernels for the H200 (sm_90).

    PYTHONPATH=/work/tri36:packages/flashattn-triton/src python scripts/flash_bwd_regs.py

Compiles the dK/dV and dQ kernels at a few tile configs (causal and not, D64/D128, bf16) and prints
registers per thread and spilled bytes. The GPU is not needed: Triton targets sm_90 directly.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "flashattn-triton" / "src"))

import triton  # noqa: E402
from flashattn_triton.ops import flash_attn as F  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

PTRS = {"Q", "K", "V", "DO", "LSE", "DELTA", "DK", "DV", "DQA", "DQ"}
FLOATS = {"sm_scale", "qk2"}


def ptxas_stats(k) -> tuple[int, int]:
    """(registers, spill store bytes) from ptxas -v on the kernel's PTX (CompiledKernel.n_regs needs a GPU)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(k.asm["ptx"])
        out = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", str(ptx), "-o", str(Path(tmp) / "k.o")],
            capture_output=True,
            text=True,
        ).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spill = int(re.search(r"(\d+) bytes spill stores", out).group(1))
    return regs, spill


def compile_one(kernel, consts: dict, num_warps: int, num_stages: int):
    fn = kernel.fn if hasattr(kernel, "fn") else kernel
    sig, cexp = {}, {}
    for name, p in inspect.signature(fn).parameters.items():
        if name in consts:
            sig[name], cexp[name] = "constexpr", consts[name]
        elif p.default is not inspect.Parameter.empty:  # constexpr with a default (OFF32, TMA ...)
            sig[name], cexp[name] = "constexpr", p.default
        elif name in ("cu_q", "cu_k"):
            sig[name], cexp[name] = "constexpr", None
        elif name in ("Q", "DO") and consts.get("TMA"):
            sig[name] = f"tensordesc<bf16[1, 1, {consts['BLOCK_M']}, {consts['BLOCK_D']}]>"
        elif name in PTRS:
            sig[name] = "*fp32" if name in ("LSE", "DELTA", "DQA") else "*bf16"
        elif name in FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    # what the launcher specializes for contiguous power-of-two shapes: 16-aligned pointers, strides, lengths
    div = [
        n
        for n, t in sig.items()
        if t != "constexpr"
        and not t.startswith("tensordesc")
        and (n in PTRS or (n[0] == "s" and n != "sm_scale") or n in ("Nq", "Nk"))
    ]
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in div}
    src = triton.compiler.ASTSource(fn=kernel, signature=sig, constexprs=cexp, attrs=attrs)
    return triton.compile(
        src, target=GPUTarget("cuda", 90, 128), options=dict(num_warps=num_warps, num_stages=num_stages)
    )


# dK/dV kernel variants (constexprs the launcher sets): the old 64-bit offsets, 32-bit offsets, TMA Q/dO loads,
# TMA + one causal loop
VARIANTS = {
    "int64": dict(OFF32=False),
    "int32": dict(OFF32=True),
    "tma": dict(OFF32=True, TMA=True),
    "tma1": dict(OFF32=True, TMA=True, ONE_LOOP=True),
}


def main() -> None:
    cfgs = [(64, 128, 8, 3), (128, 128, 8, 2), (64, 128, 4, 3)]
    print(f"triton {triton.__version__} sm_90: registers/thread, spill-store bytes (dQ tile = BN1 x BM1)")
    for d in (128, 64):
        for causal in (False, True):
            for bm, bn, w, s in cfgs:
                base = dict(HEAD_DIM=d, BLOCK_D=d, CAUSAL=causal, VARLEN=False, DOT_PREC="tf32")
                row = []
                jobs = [
                    (n, F._bwd_dkdv_kernel, dict(BLOCK_M=bm, BLOCK_N=bn, DQ_ATOMIC=False, **v))
                    for n, v in VARIANTS.items()
                ]
                jobs.append(("dq", F._bwd_dq_kernel, dict(BLOCK_M=bn, BLOCK_N=bm)))
                for name, kern, c in jobs:
                    if name == "tma1" and not causal:
                        continue
                    try:
                        regs, spill = ptxas_stats(compile_one(kern, {**base, **c}, w, s))
                        row.append(f"{name} {regs}/{spill}")
                    except Exception as e:  # out of shared memory etc.
                        row.append(f"{name} FAIL {type(e).__name__}")
                print(f"D{d} causal={int(causal)} {bm}x{bn} w{w} s{s}: " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
