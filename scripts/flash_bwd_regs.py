"""Offline (no GPU) register / spill check of the flash backward kernels for the H200 (sm_90).

    PYTHONPATH=/work/tri36:packages/flashattn-triton/src python scripts/flash_bwd_regs.py [--knobs]

Compiles the dK/dV and dQ kernels at a few tile configs (causal and not, D64/D128, bf16) and prints
registers per thread and spilled bytes. The GPU is not needed: Triton targets sm_90 directly.
--knobs: the D128 configs of scripts/probe_flash_bwd_sweep.py (dQ warps/stages, maxnreg, the fused launch).
--dq-atomic: the atomic-dQ dK/dV kernel, scalar atomics (DQ_ATOMIC 1) against one TMA reduce per tile (2).
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

PTRS = {"Q", "K", "V", "DO", "QD", "DOD", "LSE", "DELTA", "DK", "DV", "DQ", "DQA"}
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


DKDV, DQK = "dkdv", "dq"  # the split launch's two parts: PART 1 / PART 2 of F._bwd_kernel


def resolve(kernel, consts: dict):
    """DKDV / DQK with BLOCK_M, BLOCK_N -> (F._bwd_kernel, that part's tile; the other part compiled out)."""
    if kernel not in (DKDV, DQK):
        return kernel, consts
    c = dict(consts)
    bm, bn = c.pop("BLOCK_M"), c.pop("BLOCK_N")
    one, other = ("1", "2") if kernel == DKDV else ("2", "1")
    c.update({f"BLOCK_M{one}": bm, f"BLOCK_N{one}": bn, f"BLOCK_M{other}": 16, f"BLOCK_N{other}": 16, "PART": int(one)})
    return F._bwd_kernel, c


def compile_one(kernel, consts: dict, num_warps: int, num_stages: int, maxnreg: int | None = None):
    kernel, consts = resolve(kernel, consts)
    fn = kernel.fn if hasattr(kernel, "fn") else kernel
    sig, cexp = {}, {}
    for name, p in inspect.signature(fn).parameters.items():
        if name in consts:
            sig[name], cexp[name] = "constexpr", consts[name]
        elif p.default is not inspect.Parameter.empty:  # constexpr with a default (OFF32, TMA ...)
            sig[name], cexp[name] = "constexpr", p.default
        elif name in ("cu_q", "cu_k"):
            sig[name], cexp[name] = "constexpr", None
        elif consts.get("TMA") and name in (("QD", "DOD") if "BLOCK_M1" in consts else ("Q", "DO")):
            # the dK/dV loop's Q/dO descriptors (the fused kernel keeps Q/DO as pointers for its dQ programs)
            bm = consts.get("BLOCK_M1", consts.get("BLOCK_M"))
            sig[name] = f"tensordesc<bf16[1, 1, {bm}, {consts['BLOCK_D']}]>"
        elif name == "DQA" and consts.get("DQ_ATOMIC") == 2:  # the fp32 accumulator as a TMA-reduce descriptor
            bm = consts.get("BLOCK_M1", consts.get("BLOCK_M"))
            sig[name] = f"tensordesc<fp32[1, 1, {bm}, {consts['BLOCK_D']}]>"
        elif name in PTRS:
            fp32 = name in ("LSE", "DELTA") or (name == "DQA" and consts.get("DQ_ATOMIC"))  # the atomic accumulator
            sig[name] = "*fp32" if fp32 else "*bf16"
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
    opts = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 128), options=opts)


# dK/dV kernel variants (constexprs the launcher sets): the old 64-bit offsets, 32-bit offsets, TMA Q/dO loads,
# TMA + one causal loop
VARIANTS = {
    "int64": dict(OFF32=False),
    "int32": dict(OFF32=True),
    "tma": dict(OFF32=True, TMA=True),
    "tma1": dict(OFF32=True, TMA=True, ONE_LOOP=True),
}


def stats(kern, consts: dict, w: int, s: int, maxnreg: int | None = None) -> str:
    try:
        k = compile_one(kern, consts, w, s, maxnreg)
    except Exception as e:  # out of shared memory etc.
        return f"FAIL {type(e).__name__}"
    regs, spill = ptxas_stats(k)
    wgmma = "wgmma" if "wgmma.mma_async" in k.asm["ptx"] else "NO-wgmma"
    tma = " tma" if "cp.async.bulk.tensor" in k.asm["ptx"] else ""
    return f"{regs}/{spill} {wgmma}{tma} smem={k.metadata.shared}"


def knobs() -> None:
    """The D128 bf16 configs the sweep probe times: split dQ warps/stages, maxnreg caps, the fused launch."""
    print(f"triton {triton.__version__} sm_90 D128 bf16: regs/spill-bytes, wgmma, TMA, shared memory")
    for causal in (False, True):
        base = dict(HEAD_DIM=128, BLOCK_D=128, CAUSAL=causal, VARLEN=False, DOT_PREC="tf32", OFF32=True)
        one = dict(ONE_LOOP=causal)
        jobs = [
            (
                "dkdv 64x128 w8s3 tma",
                DKDV,
                dict(BLOCK_M=64, BLOCK_N=128, DQ_ATOMIC=False, TMA=True, **one),
                8,
                3,
                None,
            ),
            ("dkdv 64x128 w8s3", DKDV, dict(BLOCK_M=64, BLOCK_N=128, DQ_ATOMIC=False), 8, 3, None),
            (
                "dkdv 64x128 w8s3 tma maxnreg240",
                DKDV,
                dict(BLOCK_M=64, BLOCK_N=128, DQ_ATOMIC=False, TMA=True, **one),
                8,
                3,
                240,
            ),
            (
                "dkdv 32x64 w4s4 tma",
                DKDV,
                dict(BLOCK_M=32, BLOCK_N=64, DQ_ATOMIC=False, TMA=True, **one),
                4,
                4,
                None,
            ),
            ("dq 128x64 w8s3", DQK, dict(BLOCK_M=128, BLOCK_N=64), 8, 3, None),
            ("dq 128x64 w8s2", DQK, dict(BLOCK_M=128, BLOCK_N=64), 8, 2, None),
            ("dq 128x128 w8s2", DQK, dict(BLOCK_M=128, BLOCK_N=128), 8, 2, None),
            ("dq 64x64 w4s3", DQK, dict(BLOCK_M=64, BLOCK_N=64), 4, 3, None),
            ("dq 64x128 w4s3", DQK, dict(BLOCK_M=64, BLOCK_N=128), 4, 3, None),
            ("dq 128x64 w8s3 maxnreg240", DQK, dict(BLOCK_M=128, BLOCK_N=64), 8, 3, 240),
        ]
        fz = dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64)
        jobs += [
            ("fused 64x128/128x64 w8s3 tma", F._bwd_kernel, dict(fz, TMA=True, **one), 8, 3, None),
            ("fused 64x128/128x64 w8s3", F._bwd_kernel, dict(fz), 8, 3, None),
            (
                "fused 32x64/64x32 w4s4 tma",
                F._bwd_kernel,
                dict(BLOCK_M1=32, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=32, TMA=True, **one),
                4,
                4,
                None,
            ),
        ]
        for name, kern, c, w, st, mr in jobs:
            print(f"  causal={int(causal)} {name}: {stats(kern, {**base, **c}, w, st, mr)}", flush=True)


def dq_atomic() -> None:
    """The atomic-dQ dK/dV kernel (5 GEMMs; dQ added by scalar atomics or one TMA reduce per tile), D128 bf16."""
    print(f"triton {triton.__version__} sm_90 D128 bf16 atomic dQ: regs/spill-bytes, wgmma, TMA, shared memory")
    for causal in (False, True):
        base = dict(HEAD_DIM=128, BLOCK_D=128, CAUSAL=causal, VARLEN=False, DOT_PREC="tf32", OFF32=True)
        for mode in (1, 2):
            for bm, bn, w, s in ((64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 3), (64, 64, 4, 3), (64, 64, 8, 3)):
                for tma in (False, True):
                    c = dict(BLOCK_M=bm, BLOCK_N=bn, DQ_ATOMIC=mode, TMA=tma)
                    name = f"atomic{mode} {bm}x{bn} w{w}s{s}{' tma' if tma else ''}"
                    print(f"  causal={int(causal)} {name}: {stats(DKDV, {**base, **c}, w, s)}", flush=True)


def main() -> None:
    if "--knobs" in sys.argv:
        return knobs()
    if "--dq-atomic" in sys.argv:
        return dq_atomic()
    cfgs = [(64, 128, 8, 3), (128, 128, 8, 2), (64, 128, 4, 3)]
    print(f"triton {triton.__version__} sm_90: registers/thread, spill-store bytes (dQ tile = BN1 x BM1)")
    for d in (128, 64):
        for causal in (False, True):
            for bm, bn, w, s in cfgs:
                base = dict(HEAD_DIM=d, BLOCK_D=d, CAUSAL=causal, VARLEN=False, DOT_PREC="tf32")
                row = []
                jobs = [(n, DKDV, dict(BLOCK_M=bm, BLOCK_N=bn, DQ_ATOMIC=False, **v)) for n, v in VARIANTS.items()]
                jobs.append(("dq", DQK, dict(BLOCK_M=bn, BLOCK_N=bm)))
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
