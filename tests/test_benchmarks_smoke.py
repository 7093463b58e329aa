"""CPU smoke of the benchmark scripts (what `nox -s bench` runs without a GPU): the harness,
every suite, the merged results, ratio plots, roofline and the profiler breakdown run end to end
and produce well-formed, finite numbers. Timings themselves need a GPU."""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke pass: on a GPU run_all is the real suite")


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the smoke pass runs the Triton kernels under TRITON_INTERPRET=1 (set by nox -s tests)")
    from benchmarks import run_all

    out = tmp_path_factory.mktemp("bench") / "smoke.json"
    stream = out.with_name("stream.jsonl")
    os.environ["LLMK_BENCH_STREAM"] = str(stream)
    try:
        assert run_all.main(["--json", str(out), "--plot"]) == 0
    finally:
        del os.environ["LLMK_BENCH_STREAM"]
    return out, stream


def test_run_all_records_every_suite_with_anchor_ratios(smoke_results):
    out, _ = smoke_results
    data = json.loads(out.read_text())
    assert data["smoke"] is True and "smoke" in data["env"]["mode"]
    suites = {r["suite"] for r in data["records"]}
    assert {"attn-fwd", "attn-bwd", "attn-decode", "rmsnorm"} <= suites
    assert any(s.startswith("int8") for s in suites)
    for r in data["records"]:
        assert r["ms"] > 0 and math.isfinite(r["ms"])
        if r["anchor"] is not None:
            assert r["ratio_vs_anchor"] > 0
    assert "SMOKE PASS" in out.with_suffix(".md").read_text()
    pngs = list(out.parent.glob("smoke-*.png"))
    assert len(pngs) >= 4 and all(p.stat().st_size > 1000 for p in pngs)


def test_merge_roofline_and_profile(smoke_results, tmp_path):
    from benchmarks import merge_results, profile_kernels, roofline

    out, stream = smoke_results
    n_stream = len(stream.read_text().splitlines())
    assert n_stream == len(json.loads(out.read_text())["records"])
    assert merge_results.main([str(stream), "--out-dir", str(tmp_path)]) == 0
    merged = tmp_path / (tmp_path / "merged_name").read_text()
    assert len(json.loads(merged.read_text())["records"]) == n_stream

    assert roofline.main([str(merged), "--out", str(tmp_path)]) == 0
    roof = json.loads(next(tmp_path.glob("*-roofline.json")).read_text())
    assert roof["ceilings"]["copy_bytes_per_s"] > 0 and roof["rows"]
    assert all(r["pct"] > 0 for r in roof["rows"])
    assert next(tmp_path.glob("*-roofline.png")).stat().st_size > 1000
    # --ceilings: redraw on given (GPU-measured) ceilings; the percentages follow them
    fake = {"env": {"gpu": "X"}, "ceilings": {k: v * 2 for k, v in roof["ceilings"].items()}}
    (tmp_path / "ceil.json").write_text(json.dumps(fake))
    redo = tmp_path / "redo"
    assert roofline.main([str(merged), "--out", str(redo), "--ceilings", str(tmp_path / "ceil.json")]) == 0
    roof2 = json.loads(next(redo.glob("*-roofline.json")).read_text())
    assert roof2["env"] == {"gpu": "X"} and roof2["ceilings"] == fake["ceilings"]
    assert [r["roof"] for r in roof2["rows"]] == [2 * r["roof"] for r in roof["rows"]]

    assert profile_kernels.main(["--no-ncu", "--iters", "1", "--out", str(tmp_path)]) == 0
    prof = json.loads((tmp_path / "profile_kernels.json").read_text())
    assert set(prof) == {"attention", "int8", "rmsnorm"}
    assert all(prof[op]["torch_profiler"] for op in prof)


def test_compare_interleaves_rounds_and_keeps_each_impls_median(monkeypatch):
    from benchmarks import harness

    calls, fake_ms = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([9.0, 7.0, 8.0])}

    def fake_time_ms(fn, *, small=False, rep_ms=100):
        name = fn()
        calls.append(name)
        if name == "c":
            raise RuntimeError("backend unavailable")
        return next(fake_ms[name])

    monkeypatch.setattr(harness, "time_ms", fake_time_ms)
    monkeypatch.setenv("LLMK_BENCH_ROUNDS", "3")
    recs = harness.Suite("t").compare("case", {}, {n: (lambda n=n: n) for n in "abc"}, anchor="a", note="n")
    # every other round runs in reverse order; a failing impl is dropped after its first failure
    assert calls == ["a", "b", "c", "b", "a", "a", "b"]
    by = {r.impl: r for r in recs}
    assert set(by) == {"a", "b"}
    assert by["a"].ms == 2.0 and by["b"].ms == 8.0 and by["b"].ratio_vs_anchor == 0.25
    assert by["b"].note == "n; 3 interleaved rounds (median)"
    monkeypatch.setenv("LLMK_BENCH_ROUNDS", "0")
    with pytest.raises(ValueError, match="LLMK_BENCH_ROUNDS"):
        harness.bench_rounds()
