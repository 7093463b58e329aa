"""Offline sm_90a check of the swap-AB decode kernel (no GPU): compile each probe candidate with
the installed Triton and print registers, spills, shared memory and the SASS opcode counts
(IGMMA = int8 wgmma, UTMALDG = TMA load, see scripts/int8_sass.py).

    PYTHONPATH=/work/tri36 python scripts/int8_swapab_sass.py [--ptx-grep PATTERN]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "int8-gemm" / "src"))
_spec = importlib.util.spec_from_file_location("int8_sass", REPO / "scripts" / "int8_sass.py")
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)


def compile_swapab(bn, bk, stages, split_k, pdl=False, warps=4, bt=16, arch=90):
    import triton
    from int8_gemm.ops import gemm as G
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = G._int8_gemm_swapab_kernel
    types = [f"tensordesc<i8[{bn}, {bk}]>", f"tensordesc<i8[{bt}, {bk}]>", "*bf16", "*i32", "*i32", "*fp32", "*fp32"]
    types += ["*bf16"] + ["i32"] * 7
    consts = dict(
        HAS_BIAS=False, OUT_INT32=False, BLOCK_N=bn, BLOCK_T=bt, BLOCK_K=bk, SPLIT_K=split_k,
        FUSED_REDUCE=split_k > 1, PDL_WAIT=pdl, WS_I32=split_k > 1,
    )  # fmt: skip
    sig = dict(zip(fn.arg_names, types)) | {k: "constexpr" for k in consts}
    div = ["c_ptr", "ws_ptr", "cnt_ptr", "sa_ptr", "sb_ptr", "bias_ptr", "N", "K", "stride_cm"]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in div}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 128), options=dict(num_warps=warps, num_stages=stages))


def resource_usage(cubin: bytes) -> tuple[int, int, int]:
    """(registers, stack bytes, local-memory bytes) from cuobjdump (n_regs needs a GPU to load)."""
    import re
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([S.cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) .*LOCAL:(\d+)", out)
    return tuple(int(v) for v in m.groups()) if m else (-1, -1, -1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx-grep", default="", help="also print PTX lines containing this string (first config)")
    args = ap.parse_args()
    import triton

    print(f"triton {triton.__version__}, sm_90a, num_warps 4 (one warpgroup)")
    cands = [(64, 256, 6, 4), (128, 256, 4, 4), (128, 128, 6, 1), (64, 512, 4, 1), (128, 512, 3, 4), (64, 256, 4, 4)]
    for i, (bn, bk, st, sk) in enumerate(cands):
        for pdl in (False, True) if i == 0 else (False,):
            k = compile_swapab(bn, bk, st, sk, pdl)
            hits, total, ex = S.summarize(k.asm["cubin"])
            regs, stack, local = resource_usage(k.asm["cubin"])
            ttgir = k.asm["ttgir"]
            line = (
                f"BN{bn} BK{bk} s{st} sk{sk} pdl{int(pdl)}: regs={regs} stack={stack} local={local} "
                f"smem={k.metadata.shared} {json.dumps(hits)} total={total} e.g. {', '.join(ex)}"
                f" wgmma_in_ttgir={'warp_group_dot' in ttgir}"
            )
            print(line, flush=True)
            if i == 0 and not pdl and args.ptx_grep:
                for ln in k.asm["ptx"].splitlines():
                    if args.ptx_grep in ln:
                        print("   ", ln.strip())


if __name__ == "__main__":
    main()
