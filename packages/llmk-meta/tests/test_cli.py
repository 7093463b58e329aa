"""``llmk info`` and ``llmk bench`` (smoke pass on CPU through benchmarks/run_all.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import llm_kernels
import pytest
import torch
from llm_kernels import cli


def _env() -> dict[str, str]:
    # the subprocess must import exactly the packages this test process imported
    mods = ("flashattn_triton", "int8_gemm", "fused_rmsnorm", "llm_kernels")
    paths = [str(Path(__import__(m).__file__).resolve().parent.parent) for m in mods]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    return env


def test_info_prints_versions_and_backends(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for name, ver in llm_kernels.versions().items():
        assert f"{name}" in out and str(ver) in out
    for op in ("flash_attn_forward", "int8_gemm_dequant_fwd", "quantize_symmetric", "fused_rmsnorm_linear"):
        assert op in out
    assert ("GPU:      none" in out) != torch.cuda.is_available()


def test_info_json_is_consistent(capsys):
    assert cli.main(["info", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["versions"] == json.loads(json.dumps(llm_kernels.versions()))
    assert set(d["backends"]) >= {"flash_attn_forward", "int8_linear", "fused_rmsnorm_linear"}
    if not torch.cuda.is_available():
        assert d["gpu"] is None
        assert d["backends"]["fused_rmsnorm_linear"]["backend"] == "torch"
        assert d["backends"]["flash_attn_forward"]["backend"] == (
            "interpreter" if d["interpreter_enabled"] else "torch"
        )


def test_cli_rejects_unknown_suite(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "nonsense"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_console_entry_point_declared():
    from importlib import metadata

    try:  # installed (nox, pip): the real console-script entry point
        eps = metadata.distribution("llmk-meta").entry_points
        assert any(ep.name == "llmk" and ep.value == "llm_kernels.cli:main" for ep in eps)
    except metadata.PackageNotFoundError:  # run from the source tree (PYTHONPATH)
        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
        assert 'llmk = "llm_kernels.cli:main"' in text


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="the CPU smoke pass; GPU runs the real suite via scripts/gpu_run.sh"
)
def test_bench_quick_smoke_cpu(tmp_path):
    """``llmk bench <suite> --quick`` on CPU: a labelled smoke pass (tiny sizes, interpreter) writing JSON + markdown.

    Runs the int8 suite only (the three suites together take minutes under the interpreter on 2 cores);
    the delegation to run_all is the same for every suite name.
    """
    suite = "int8"
    if not (Path(cli.__file__).resolve().parent / "_benchmarks" / "bench_int8.py").exists():
        pytest.fail("benchmarks/bench_int8.py is missing: `llmk bench` has nothing to run")
    out = tmp_path / "res.json"
    proc = subprocess.run(
        [sys.executable, "-m", "llm_kernels.cli", "bench", suite, "--quick", "--json", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SMOKE PASS" in proc.stdout
    assert "| suite | case | impl |" in proc.stdout  # the ratio table
    assert "[1]" in proc.stderr  # the progress line
    data = json.loads(out.read_text())
    assert data["smoke"] is True and data["records"]
    assert {r["suite"] for r in data["records"]} and all(r["ms"] > 0 for r in data["records"])
    assert out.with_suffix(".md").exists()


def test_bench_arguments_reach_run_all(monkeypatch):
    """Suites/flags pass through unchanged; without --json the results go under ./llmk-bench-results/."""
    seen = []
    monkeypatch.setattr(cli, "_bench", lambda argv: seen.append(argv) or 0)
    assert cli.main(["bench", "attention", "int8", "--quick", "--plot"]) == 0
    argv = seen[-1]
    assert argv[:4] == ["attention", "int8", "--quick", "--plot"]
    assert argv[4] == "--json" and argv[5].startswith("llmk-bench-results") and argv[5].endswith(".json")
    assert cli.main(["bench", "--json", "x/y.json"]) == 0
    assert seen[-1] == ["all", "--json", "x/y.json"]
