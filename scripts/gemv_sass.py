"""Offline sm90 compile of the decode GEMV kernel (no GPU): registers, spills, load widths.

    PYTHONPATH=/work/tri36 python scripts/gemv_sass.py

One line per (config, M, mode): regs, spills, count of 128-bit global loads (LDG.E.128) and other
LDG widths in the SASS, IMAD / IDP (dp4a) counts.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "int8-gemm" / "src"))
sys.path.insert(0, str(REPO / "scripts"))


def main() -> None:
    import triton
    from flash_bwd_regs import ptxas_stats
    from int8_gemm.ops import gemm as G
    from int8_sass import cuobjdump
    from probe_int8 import GEMV_CANDS
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    print(f"triton {triton.__version__}, sm_90")
    fn = G._int8_gemv_kernel

    def div16(names):
        return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}

    cands = dict(GEMV_CANDS, **{"byte-wise 16x512 w4": dict(GEMV_CANDS["V2 gemv dp4a 16x512 w4"], DP4A=0)})
    for name, cfg in cands.items():
        for M in (1, 16):
            for quant in (False, True):
                types = ["*bf16" if quant else "*i8", "*i8", "*bf16", "*i32", "*i32", "*fp32", "*fp32", "*fp32"]
                types += ["i32"] * 11
                consts = dict(
                    HAS_BIAS=False, OUT_INT32=False, A_K_CONTIG=True, EVEN_K=True, ROWS=M,
                    BLOCK_M=triton.next_power_of_2(M), BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                    SPLIT_K=2, FUSED_REDUCE=True, QUANT_A=quant, MIN_AMAX=1e-30, WS_I32=True,
                    DP4A=bool(cfg.get("DP4A", 0)), DP4A_ASM=bool(cfg.get("DP4A", 0)),
                )  # fmt: skip
                if quant:
                    consts.update(AMAX_CHUNK=4096, AMAX_NCHUNK=1) if M == 1 else consts.update(AMAX_CHUNK=256)
                consts = {k: v for k, v in consts.items() if k in fn.arg_names}
                sig = dict(zip(fn.arg_names, types)) | {k: "constexpr" for k in consts}
                attrs = div16(["a_ptr", "b_ptr", "c_ptr", "ws_ptr", "cnt_ptr", "sa_ptr", "sb_ptr", "N", "K"])
                attrs |= div16(["stride_am", "stride_bn", "stride_cm"])
                k = triton.compile(
                    ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                    target=GPUTarget("cuda", 90, 32),
                    options=dict(num_warps=cfg["num_warps"], num_stages=cfg.get("num_stages", 1)),
                )
                with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                    f.write(k.asm["cubin"])
                sass = subprocess.run([cuobjdump(), "--dump-sass", f.name], capture_output=True, text=True).stdout
                ldg = re.findall(r"\bLDG\.E(\.[A-Z0-9.]+)?", sass)
                widths = {}
                for w in ldg:
                    widths[w or ".32"] = widths.get(w or ".32", 0) + 1
                regs, spills = ptxas_stats(k)
                imad = len(re.findall(r"\bIMAD\b", sass))
                idp = len(re.findall(r"\bIDP", sass))
                print(f"{name:<28} M={M:<2} {'fused' if quant else 'int8x':<5} regs={regs:<3} "
                      f"spills={spills} LDG={widths} IMAD={imad} IDP={idp}")  # fmt: skip


if __name__ == "__main__":
    main()
