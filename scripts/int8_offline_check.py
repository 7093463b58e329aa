"""Compile the int8 GEMM candidates for sm_90a offline (no GPU) and report what the H200 would run.

    PYTHONPATH=/work/tri36 python scripts/int8_offline_check.py [--quick]

For each candidate (the configs scripts/probe_int8.py sweeps): IGMMA (wgmma int8) and UTMALDG
(TMA load) counts, L2 prefetches, griddepcontrol (PDL), registers per thread, local-memory spill
bytes and shared memory, read from the cubin with the cuobjdump inside Triton's NVIDIA backend.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "int8-gemm" / "src"))
sys.path.insert(0, str(REPO / "scripts"))

import triton  # noqa: E402
from int8_gemm.ops import gemm as G  # noqa: E402
from int8_gemm.ops import quantize as Q  # noqa: E402
from int8_sass import cuobjdump  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def _div16(fn, names):
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}


def inspect(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    sass = subprocess.run([cuobjdump(), "--dump-sass", path], capture_output=True, text=True).stdout
    res = subprocess.run([cuobjdump(), "--dump-resource-usage", path], capture_output=True, text=True).stdout
    Path(path).unlink()
    ops = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", sass, re.M)
    count = lambda p: sum(1 for o in ops if o.startswith(p))  # noqa: E731
    reg = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    lmem = re.search(r"LOCAL:(\d+)", res)
    shared = re.search(r"SHARED:(\d+)", res)
    return dict(
        IGMMA=count("IGMMA"),
        IMMA=count("IMMA"),
        UTMALDG=count("UTMALDG"),
        LDGSTS=count("LDGSTS"),
        CCTL=count("CCTL"),  # prefetch.global.L2 lowers to CCTL
        ACQBULK=count("ACQBULK"),
        regs=int(reg.group(1)) if reg else -1,
        stack=int(stack.group(1)) if stack else -1,
        local=int(lmem.group(1)) if lmem else -1,
        shared=int(shared.group(1)) if shared else -1,
        ldl_stl=sum(1 for o in ops if o.startswith(("LDL", "STL"))),
    )


def compile_std(cfg: dict, M: int, N: int, K: int, split: int, quant_a: bool = False, pdl: bool = False):
    fn = G._int8_gemm_kernel
    a_t = "*bf16" if quant_a else "*i8"
    types = [a_t, "*i8", "*bf16", "*i32", "*i32", "*fp32", "*fp32", "*fp32"] + ["i32"] * 11
    bk = cfg["BLOCK_K"]
    consts = dict(
        HAS_BIAS=False, OUT_INT32=False, A_K_CONTIG=True, B_K_CONTIG=True, B_N_CONTIG=False,
        EVEN_K=K % (bk * split) == 0, EVEN_M=M % cfg["BLOCK_M"] == 0, EVEN_N=N % cfg["BLOCK_N"] == 0,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=bk, GROUP_M=cfg.get("GROUP_M", 1),
        SPLIT_K=split, FUSED_REDUCE=split > 1, QUANT_A=quant_a, MIN_AMAX=Q.MIN_ABSMAX,
    )  # fmt: skip
    consts |= dict(AMAX_ONE_ROW=False, AMAX_CHUNK=1024, AMAX_NCHUNK=0, PF_LINES=0, PDL_WAIT=False)  # JIT defaults
    consts["WS_I32"] = split > 1 and split * M * N < 2**31
    if quant_a and M == 1:
        ch = min(G._AMAX_CHUNK_MAX, triton.next_power_of_2(K))
        consts |= dict(AMAX_ONE_ROW=True, AMAX_CHUNK=ch, AMAX_NCHUNK=-(-K // ch))
    if cfg.get("PREFETCH"):
        kps = G.cdiv(G.cdiv(K, bk), split) * bk
        consts["PF_LINES"] = triton.next_power_of_2(-(-kps // 128))
    if pdl:
        consts["PDL_WAIT"] = True
    sig = dict(zip(fn.arg_names, types)) | {k: "constexpr" for k in consts}
    attrs = _div16(fn, ["a_ptr", "b_ptr", "c_ptr", "ws_ptr", "cnt_ptr", "sa_ptr", "sb_ptr", "M", "N", "K"])
    attrs |= _div16(fn, ["stride_am", "stride_bn", "stride_cm"])
    opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=pdl)
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=TARGET, options=opts)


def compile_tma(cfg: dict):
    tf = G._int8_gemm_tma_kernel
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    tsig = dict(zip(tf.arg_names, [f"tensordesc<i8[{bm}, {bk}]>", f"tensordesc<i8[{bn}, {bk}]>"]))
    tsig |= dict(zip(tf.arg_names[2:14], ["*bf16", "*fp32", "*fp32", "*fp32"] + ["i32"] * 8))
    tconsts = dict(HAS_BIAS=False, OUT_INT32=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)
    tconsts |= dict(EPI_SPLIT=cfg.get("EPI_SPLIT", 1), WARP_SPEC=bool(cfg.get("WARP_SPEC", 0)))
    tsig |= {k: "constexpr" for k in tconsts}
    tattrs = _div16(tf, ["c_ptr", "sa_ptr", "sb_ptr", "M", "N", "K", "stride_cm"])
    opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return triton.compile(
        ASTSource(fn=tf, signature=tsig, constexprs=tconsts, attrs=tattrs), target=TARGET, options=opts
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "scripts"))
    from probe_int8 import candidate_sets, cfg_name

    print(f"triton {triton.__version__}, target sm_90a (offline compile)")
    seen = set()
    for group, (M, N, K), cfg, mode in candidate_sets(quick=args.quick):
        if mode in ("module", "e2e"):
            continue
        if cfg is None:
            cfg = G._table().lookup("sm90", M=M, N=N, K=K, b_kmajor=True)
        if mode in ("two", "module"):
            mode = "gemm"
        key = (json_key := repr(sorted(cfg.items()))) + mode + (f"{M}x{N}x{K}" if not cfg.get("TMA") else "")
        if key in seen:
            continue
        seen.add(key)
        try:
            if cfg.get("TMA"):
                k = compile_tma(cfg)
            else:
                split = cfg.get("SPLIT_K", 1) or 4
                k = compile_std(cfg, M, N, K, split, quant_a=mode == "fused", pdl=mode == "pdl")
            info = inspect(k.asm["cubin"])
            ws = "ws" if "warp_specialize" in k.asm["ttgir"] or "ttg.warp_specialize" in k.asm["ttgir"] else ""
            info = " ".join(f"{k}={v}" for k, v in info.items())
            print(f"{group:<7} {M}x{N}x{K:<12} {mode:<5} {cfg_name(cfg)[:34]:<34} {info} {ws}", flush=True)
        except Exception as e:  # report, keep going
            print(
                f"{group:<8} {M}x{N}x{K:<6} {mode:<5} {json_key[:150]} COMPILE FAILED: {str(e).splitlines()[0][:200]}"
            )


if __name__ == "__main__":
    main()
