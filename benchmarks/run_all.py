"""Run every kernel's benchmark suite against its anchors and write JSON + markdown (+ plots).

    python benchmarks/run_all.py [attention|int8|rmsnorm|all ...] [--quick] [--json PATH] [--plot]

On a CUDA machine this is the real suite; without one it is a labelled smoke pass
(tiny sizes, Triton interpreter) that exercises the harness end to end.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the relative imports below work
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "benchmarks"

from . import harness  # noqa: E402

SUITES = {"attention": "bench_attention", "int8": "bench_int8", "rmsnorm": "bench_rmsnorm"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # (no argparse `choices`: with nargs="*" it rejects the default list on Python < 3.12)
    ap.add_argument("suites", nargs="*", default=["all"], help=f"any of {', '.join([*SUITES, 'all'])}")
    ap.add_argument("--quick", action="store_true", help="a short pass (about a minute on a GPU)")
    ap.add_argument("--json", type=Path, default=None, help="output JSON (default benchmarks/results/<gpu>.json)")
    ap.add_argument("--plot", action="store_true", help="also write ratio plots beside the JSON")
    args = ap.parse_args(argv)
    bad = [s for s in args.suites if s not in (*SUITES, "all")]
    if bad:
        ap.error(f"unknown suite(s) {bad}; choose from {[*SUITES, 'all']}")

    if harness.smoke_mode():
        # Smoke pass: the Triton kernels run under the interpreter on CPU tensors.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        print("SMOKE PASS: no CUDA GPU found. Tiny sizes under the Triton interpreter; timings need a GPU.")
    names = list(SUITES) if "all" in args.suites else args.suites
    progress = harness.progress_printer()
    records = []
    for name in names:
        mod = importlib.import_module(f".{SUITES[name]}", __package__)
        print(f"== {name} ==", flush=True)
        records += mod.run(quick=args.quick, progress=progress)
    slug = harness.gpu_slug() + ("-quick" if args.quick and not harness.smoke_mode() else "")
    out = args.json or harness.RESULTS_DIR / f"{slug}.json"
    harness.write_results(records, out)
    if args.plot:
        from . import plots

        for p in plots.ratio_plots(out):
            print(f"plot: {p}")
    print(harness.markdown_table(records))
    print(f"\nwrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
