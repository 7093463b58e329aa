"""The ``llmk`` command line.

    llmk info [--json] [--resolve]        GPU, versions, and which backend each op will use and why
    llmk bench [attention|int8|rmsnorm|all ...] [--quick] [--json PATH] [--plot]
                                          the benchmark suites (benchmarks/run_all.py) with a progress line;
                                          JSON + markdown go to PATH (default ./llmk-bench-results/<gpu>.json)

Without a CUDA GPU ``bench`` is a labelled smoke pass: tiny sizes, Triton kernels under the interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

import torch

from .info import info

BENCH_SUITES = ("attention", "int8", "rmsnorm", "all")


def _print_info(d: dict[str, Any]) -> None:
    gpu = d["gpu"]
    if gpu:
        print(
            f"GPU:      {gpu['name']} (compute capability {gpu['compute_capability']}, {gpu['arch']}, "
            f"{gpu['sm_count']} SMs, {gpu['memory_gib']} GiB)"
        )
    else:
        print("GPU:      none (CUDA not available)")
    print(f"Python:   {d['python']} on {d['platform']}")
    print("Versions:")
    for name, ver in d["versions"].items():
        print(f"  {name:<17} {ver}")
    print(f"TRITON_INTERPRET: {d['TRITON_INTERPRET'] or '(unset)'}")
    print(f"Backends for {d['device']} tensors:")
    for op, b in d["backends"].items():
        print(f"  {op:<26} {b.get('backend', '?'):<12} {b.get('why', '')}")
        extra = b.get("package_info")
        if extra:
            print(f"  {'':<26} {'':<12} package says: {json.dumps(extra, default=str)}")


def _bench(argv: list[str]) -> int:
    from flashattn_triton._common import interpreter_enabled

    if not torch.cuda.is_available() and not interpreter_enabled():
        # Triton picks interpreter vs compiler when the kernels are decorated, i.e. at import, and this
        # process already imported them: rerun with the interpreter switched on from the start.
        env = dict(os.environ, TRITON_INTERPRET="1")
        return subprocess.call([sys.executable, "-m", "llm_kernels.cli", "bench", *argv], env=env)
    from ._benchmarks import run_all

    return int(run_all.main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="llmk", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_info = sub.add_parser("info", help="GPU, versions and the backend each op will use")
    p_info.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p_info.add_argument(
        "--resolve", action="store_true", help="resolve the CUDA extension's backend now (may JIT-compile: minutes)"
    )
    p_bench = sub.add_parser("bench", help="run the benchmark suites and print the ratio table")
    # choices checked by hand: argparse (3.11) rejects an empty nargs="*" positional that has `choices`
    p_bench.add_argument(
        "suites", nargs="*", metavar="SUITE", help=f"one or more of {', '.join(BENCH_SUITES)} (default all)"
    )
    p_bench.add_argument("--quick", action="store_true", help="a short pass")
    p_bench.add_argument("--json", metavar="PATH", default=None, help="where to write the results JSON (+ .md)")
    p_bench.add_argument("--plot", action="store_true", help="also write ratio plots beside the JSON")
    args = ap.parse_args(argv)
    if args.cmd == "bench":
        bad = [x for x in args.suites if x not in BENCH_SUITES]
        if bad:
            p_bench.error(f"invalid choice: {bad[0]!r} (choose from {', '.join(BENCH_SUITES)})")

    if args.cmd == "info":
        d = info(resolve=args.resolve)
        if args.json:
            print(json.dumps(d, indent=1, default=str))
        else:
            _print_info(d)
        return 0
    # bench: hand the (validated) arguments to benchmarks/run_all.py
    bench_argv = argv[argv.index("bench") + 1 :]
    if not args.suites:  # name the suites explicitly: run_all's own empty-list default trips the same argparse check
        bench_argv = ["all", *bench_argv]
    if args.json is None:
        # run_all's default is inside the package (site-packages when installed): write to the cwd instead
        from ._benchmarks import harness

        slug = harness.gpu_slug() + ("-quick" if args.quick and not harness.smoke_mode() else "")
        bench_argv += ["--json", os.path.join("llmk-bench-results", f"{slug}.json")]
    return _bench(bench_argv)


if __name__ == "__main__":
    sys.exit(main())
