"""Which instructions do the int8 kernels really use? Read it from the SASS.

    python scripts/int8_sass.py              # GPU: run the ops, dump the cubins Triton cached
    python scripts/int8_sass.py --arch 86    # any machine (no GPU needed): compile for sm_86
    python scripts/int8_sass.py --arch 90    #   ... or sm_90a, then disassemble

Prints one line per kernel: name, config, and counts of the matrix/dot-product opcodes
(IMMA = mma.sync int8 tensor core, IGMMA = Hopper wgmma int8, HMMA/HGMMA = fp16/bf16
tensor core, IDP = DP4A-style dot product) plus the total instruction count. Uses the
cuobjdump shipped inside Triton's NVIDIA backend when none is on PATH.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "packages" / "int8-gemm" / "src"))

OPS = ("IGMMA", "HGMMA", "IMMA", "HMMA", "IDP", "DP4A", "DP2A", "LDGSTS", "UTMALDG", "WARPGROUP")


def cuobjdump() -> str:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else (shutil.which("cuobjdump") or "cuobjdump")


def summarize(cubin: bytes | str) -> tuple[dict[str, int], int, list[str]]:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin if isinstance(cubin, bytes) else Path(cubin).read_bytes())
        path = f.name
    sass = subprocess.run([cuobjdump(), "--dump-sass", path], capture_output=True, text=True).stdout
    os.unlink(path)
    opcodes = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)", sass, re.M)
    counts = collections.Counter(op.split(".")[0] for op in opcodes)
    hits = {k: counts[k] for k in OPS if counts.get(k)}
    examples = sorted({op for op in opcodes if op.split(".")[0] in ("IGMMA", "IMMA", "IDP", "HGMMA", "HMMA")})
    return hits, len(opcodes), examples[:3]


def _line(name: str, cfg: str, cubin) -> str:
    hits, total, ex = summarize(cubin)
    return f"{name:<28} {cfg:<44} {json.dumps(hits)} total={total} e.g. {', '.join(ex) or '-'}"


# Representative launches: (label, M, N, K, config or None for the shipped table).
CASES = [
    ("large 4096^3", 4096, 4096, 4096, None),
    ("LLM M=128", 128, 14336, 4096, None),
    ("decode M=1 (split-K)", 1, 4096, 4096, None),
]


def from_gpu_cache() -> None:
    cache = tempfile.mkdtemp(prefix="int8_sass_")
    os.environ["TRITON_CACHE_DIR"] = cache  # before triton compiles anything
    import torch
    from int8_gemm import int8_linear
    from int8_gemm.ops import gemm as G

    print(f"device: {torch.cuda.get_device_name(0)} sm{''.join(map(str, torch.cuda.get_device_capability()))}")
    for label, M, N, K, cfg in CASES:
        before = set(glob.glob(f"{cache}/**/*.cubin", recursive=True))
        a = torch.randint(-127, 128, (M, K), dtype=torch.int8, device="cuda")
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8, device="cuda")
        used = cfg or G._config_for(M, N, K, a.device, True)
        G._launch(a, w.t(), torch.rand(M, device="cuda"), torch.rand(N, device="cuda"), None, torch.float16, used)
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        int8_linear(x, w, torch.rand(N, device="cuda"))
        torch.cuda.synchronize()
        for path in sorted(set(glob.glob(f"{cache}/**/*.cubin", recursive=True)) - before):
            meta = (
                json.loads(Path(path).with_suffix(".json").read_text())
                if Path(path).with_suffix(".json").exists()
                else {}
            )
            name = meta.get("name", Path(path).stem)
            short = "{BLOCK_M}x{BLOCK_N}x{BLOCK_K} sk{SPLIT_K} w{num_warps} s{num_stages}".format(**used)
            print(_line(name, f"[{label}] {short if 'gemm' in name else ''}", path))


def compile_for(arch: int) -> None:
    import triton
    from int8_gemm.ops import gemm as G
    from int8_gemm.ops import quantize as Q
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    key = f"sm{arch}" if arch != 89 else "sm86"
    table = G._table()

    def div16(fn, names):
        return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}

    def with_defaults(fn, consts):
        """consts plus every other constexpr parameter's default (ASTSource does not apply defaults)."""
        import inspect

        empty = inspect.Parameter.empty
        return {p.name: p.default for p in fn.params if p.is_constexpr and p.default is not empty} | consts

    fn = G._int8_gemm_kernel
    types = ["*i8", "*i8", "*fp16", "*i32", "*i32", "*fp32", "*fp32", "*fp32"] + ["i32"] * 11
    for label, M, N, K, _ in CASES:
        cfg = table.lookup(key, M=M, N=N, K=K, b_kmajor=True)
        split = cfg["SPLIT_K"] if cfg["SPLIT_K"] > 0 else 2
        consts = dict(
            HAS_BIAS=False,
            OUT_INT32=False,
            A_K_CONTIG=True,
            B_K_CONTIG=True,
            B_N_CONTIG=False,
            EVEN_K=True,
            EVEN_M=M % cfg["BLOCK_M"] == 0,
            EVEN_N=N % cfg["BLOCK_N"] == 0,
            BLOCK_M=cfg["BLOCK_M"],
            BLOCK_N=cfg["BLOCK_N"],
            BLOCK_K=cfg["BLOCK_K"],
            GROUP_M=cfg["GROUP_M"],
            SPLIT_K=split,
            FUSED_REDUCE=split > 1,
        )
        consts = with_defaults(fn, consts)
        sig = dict(zip(fn.arg_names, types)) | {k: "constexpr" for k in consts}
        # What the JIT would specialise for 16-aligned pointers, sizes and strides.
        attrs = div16(fn, ["a_ptr", "b_ptr", "c_ptr", "ws_ptr", "cnt_ptr", "sa_ptr", "sb_ptr", "M", "N", "K"])
        attrs |= div16(fn, ["stride_am", "stride_bn", "stride_cm"])
        src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
        k = triton.compile(src, target=target, options=dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))
        short = "{BLOCK_M}x{BLOCK_N}x{BLOCK_K} w{num_warps} s{num_stages}".format(**cfg) + f" sk{split}"
        print(_line("_int8_gemm_kernel", f"[{label}] {short}", k.asm["cubin"]))
    # The TMA variant (a tuning candidate on SM90): descriptor operands instead of pointers.
    if arch >= 90:
        tf = G._int8_gemm_tma_kernel
        bm, bn, bk = 128, 256, 128
        tsig = dict(zip(tf.arg_names, [f"tensordesc<i8[{bm}, {bk}]>", f"tensordesc<i8[{bn}, {bk}]>"]))
        tsig |= dict(zip(tf.arg_names[2:14], ["*fp16", "*fp32", "*fp32", "*fp32"] + ["i32"] * 8))
        tconsts = dict(HAS_BIAS=False, OUT_INT32=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)
        tconsts = with_defaults(tf, tconsts)
        tsig |= {k: "constexpr" for k in tconsts}
        tattrs = div16(tf, ["c_ptr", "sa_ptr", "sb_ptr", "M", "N", "K", "stride_cm"])
        k = triton.compile(
            ASTSource(fn=tf, signature=tsig, constexprs=tconsts, attrs=tattrs),
            target=target,
            options=dict(num_warps=8, num_stages=3),
        )
        print(_line("_int8_gemm_tma_kernel", f"[large, TMA persistent] {bm}x{bn}x{bk} w8 s3", k.asm["cubin"]))
    qf = Q._quantize_rows_kernel
    qsig = dict(zip(qf.arg_names, ["*bf16", "*i8", "*fp32", "i32", "i32", "i32", "i32", "i32"]))
    qconsts = with_defaults(qf, dict(MIN_AMAX=Q.MIN_ABSMAX, BLOCK_R=1, BLOCK_K=4096, ONE_PASS=True, X_K_CONTIG=True))
    qsig |= {k: "constexpr" for k in qconsts}
    k = triton.compile(
        ASTSource(fn=qf, signature=qsig, constexprs=qconsts, attrs=div16(qf, ["x_ptr", "q_ptr", "s_ptr", "K"])),
        target=target,
        options=dict(num_warps=8),
    )
    print(_line("_quantize_rows_kernel", "[K=4096 bf16]", k.asm["cubin"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, help="compile for this SM (e.g. 86, 90) without running; no GPU needed")
    args = ap.parse_args()
    if args.arch:
        print(f"compiled for sm_{args.arch} with triton {__import__('triton').__version__} (no launch)")
        compile_for(args.arch)
    else:
        from_gpu_cache()


if __name__ == "__main__":
    main()
