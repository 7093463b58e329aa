"""The one timing helper every benchmark uses.

* Large shapes: ``triton.testing.do_bench`` median after warm-up.
* Small / decode shapes (``small=True``): CUDA-graph replay
  (``triton.testing.do_bench_cudagraph``), so Python launch overhead is not measured.
* Memory-bound cases: pass several input sets; calls rotate through them so the
  inputs do not sit in L2 (H200 L2 = 60 MB).
* Every record carries FLOP and byte counts, the anchor timed in the same run and
  the ratio anchor_time / our_time (> 1 means we are faster).
* ``Suite.compare`` times the impls of a case in interleaved rounds (default 3, the order
  reversed every other round) and keeps each impl's median, so no impl owes its number to
  its place in the order.
* Without a CUDA GPU everything runs as a labelled SMOKE pass (tiny sizes, Triton
  interpreter): it proves the harness end to end; its timings mean nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def gpu_available() -> bool:
    return torch.cuda.is_available()


def smoke_mode() -> bool:
    return not gpu_available()


def env_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "platform": platform.platform(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # pragma: no cover - triton missing
        info["triton"] = None
    if gpu_available():
        p = torch.cuda.get_device_properties(0)
        info.update(
            gpu=p.name,
            sm=f"sm{p.major}{p.minor}",
            sm_count=p.multi_processor_count,
            gpu_mem_gib=round(p.total_memory / 2**30, 1),
        )
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except Exception:
            info["driver"] = None
    else:
        info.update(gpu=None, sm=None, mode="smoke (no CUDA GPU: tiny sizes, Triton interpreter; timings meaningless)")
    for mod in ("flashattn_triton", "int8_gemm", "fused_rmsnorm", "llm_kernels"):
        try:
            info[f"{mod}_version"] = __import__(mod).__version__
        except Exception:
            info[f"{mod}_version"] = None
    return info


def gpu_slug() -> str:
    if not gpu_available():
        return "cpu-smoke"
    name = torch.cuda.get_device_name(0).lower()
    for token in ("nvidia", "geforce", "tesla"):
        name = name.replace(token, "")
    return "-".join(name.split()) or "gpu"


def bench_rounds() -> int:
    """Rounds per ``Suite.compare``: env LLMK_BENCH_ROUNDS, else 3 on a GPU and 1 in smoke mode (1 = one
    impl after another, the only order before 2026-12-02)."""
    env = os.environ.get("LLMK_BENCH_ROUNDS")
    if env is None:
        return 1 if smoke_mode() else 3
    if not env.isdigit() or int(env) < 1:
        raise ValueError(f"LLMK_BENCH_ROUNDS must be a positive integer, got {env!r}")
    return int(env)


def _rotating(fns: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    if len(fns) == 1:
        return fns[0]
    state = {"i": 0}

    def call():
        i = state["i"]
        state["i"] = (i + 1) % len(fns)
        return fns[i]()

    return call


def time_ms(fn: Callable[[], Any] | Sequence[Callable[[], Any]], *, small: bool = False, rep_ms: int = 100) -> float:
    """Median milliseconds of one call. A sequence of callables is rotated through."""
    call = _rotating(fn if isinstance(fn, Sequence) else [fn])
    if smoke_mode():
        call()  # compile / warm up
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            call()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)
    import triton.testing as tt

    if small:
        # A graph freezes its inputs, so rotation = capture one call per input set back to
        # back and divide: consecutive calls then never find their inputs in L2.
        fns = list(fn) if isinstance(fn, Sequence) else [fn]

        def all_sets():
            for f in fns:
                f()

        with torch.cuda.stream(torch.cuda.Stream()):
            return float(tt.do_bench_cudagraph(all_sets, rep=rep_ms, return_mode="median")) / len(fns)
    return float(tt.do_bench(call, warmup=25, rep=rep_ms, return_mode="median"))


@dataclasses.dataclass
class Record:
    suite: str
    case: str
    shape: dict[str, Any]
    impl: str
    ms: float
    flops: float = 0.0
    bytes: float = 0.0
    anchor: str | None = None
    ratio_vs_anchor: float | None = None  # anchor_ms / ms: > 1 means faster than the anchor
    note: str = ""

    @property
    def tflops(self) -> float:
        return self.flops / (self.ms * 1e-3) / 1e12 if self.ms > 0 else 0.0

    @property
    def tbps(self) -> float:
        return self.bytes / (self.ms * 1e-3) / 1e12 if self.ms > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tflops"] = round(self.tflops, 2)
        d["tbps"] = round(self.tbps, 3)
        return d


class Suite:
    """Collects records; ``compare`` times several implementations of one case together."""

    def __init__(self, name: str, *, progress: Callable[[str], None] | None = None):
        self.name = name
        self.records: list[Record] = []
        self.progress = progress

    def compare(
        self,
        case: str,
        shape: dict[str, Any],
        impls: dict[str, Callable[[], Any] | Sequence[Callable[[], Any]]],
        *,
        anchor: str,
        flops: float = 0.0,
        bytes: float = 0.0,
        small: bool = False,
        note: str = "",
    ) -> list[Record]:
        # Interleaved rounds, the order reversed every other round, median per impl. Timed once each in a
        # fixed order, an impl's time depended on its place (H200, scripts/probe_bench_order.py: F.linear at
        # B4096 197.9 us first vs 202.2 last; the fused module at B512 29.0 / 28.3 vs 26.1 interleaved; the
        # cause, clocks or otherwise, was not pinned down).
        rounds = bench_rounds()
        samples: dict[str, list[float]] = {impl: [] for impl in impls}
        failed: set[str] = set()
        for r in range(rounds):
            order = list(impls.items()) if r % 2 == 0 else list(impls.items())[::-1]
            for impl, fn in order:
                if impl in failed:
                    continue
                if self.progress:
                    self.progress(f"{self.name}/{case} {impl}" + (f" (round {r + 1}/{rounds})" if rounds > 1 else ""))
                try:
                    samples[impl].append(time_ms(fn, small=small, rep_ms=max(20, 100 // rounds)))
                except Exception as e:  # an anchor backend may be unavailable for a shape
                    failed.add(impl)
                    print(f"  [skip] {self.name}/{case}/{impl}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        times = {impl: statistics.median(ts) for impl, ts in samples.items() if ts and impl not in failed}
        if rounds > 1:
            note = f"{note}; " if note else ""
            note += f"{rounds} interleaved rounds (median)"
        base = times.get(anchor)
        out = []
        for impl, ms in times.items():
            rec = Record(
                suite=self.name,
                case=case,
                shape=shape,
                impl=impl,
                ms=ms,
                flops=flops,
                bytes=bytes,
                anchor=anchor if impl != anchor else None,
                ratio_vs_anchor=(base / ms) if (base is not None and impl != anchor) else None,
                note=note,
            )
            out.append(rec)
        self.records.extend(out)
        stream = os.environ.get("LLMK_BENCH_STREAM")
        if stream:  # append as we go: a run cut off by a time limit keeps its finished cases
            with open(stream, "a") as f:
                for r in out:
                    f.write(json.dumps(r.to_json()) + "\n")
        return out


def markdown_table(records: Sequence[Record]) -> str:
    lines = [
        "| suite | case | impl | ms | TFLOP/s | TB/s | vs anchor |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in records:
        ratio = f"{r.ratio_vs_anchor:.2f}x {r.anchor}" if r.ratio_vs_anchor is not None else "(anchor)"
        lines.append(f"| {r.suite} | {r.case} | {r.impl} | {r.ms:.4f} | {r.tflops:.1f} | {r.tbps:.2f} | {ratio} |")
    return "\n".join(lines)


def write_results(records: Sequence[Record], path: Path, *, extra: dict[str, Any] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"env": env_info(), "smoke": smoke_mode(), "records": [r.to_json() for r in records]}
    if extra:
        payload.update(extra)
    path.write_text(json.dumps(payload, indent=1))
    path.with_suffix(".md").write_text(
        ("**SMOKE PASS (no CUDA GPU): timings are meaningless.**\n\n" if smoke_mode() else "")
        + f"Environment: `{json.dumps(payload['env'])}`\n\n"
        + markdown_table(records)
        + "\n"
    )
    return path


def progress_printer(total: int | None = None) -> Callable[[str], None]:
    """A dependency-free progress line (tqdm is not guaranteed on bare GPU machines)."""
    state = {"n": 0}

    def show(msg: str) -> None:
        state["n"] += 1
        head = f"[{state['n']}/{total}]" if total else f"[{state['n']}]"
        print(f"{head} {msg}", file=sys.stderr, flush=True)

    return show


def env_flag(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")
