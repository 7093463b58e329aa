"""CI test of experiments/attention_ablation.py: its tiny CPU mode end to end.

nox sets TRITON_INTERPRET=1, so the flash variant runs the real Triton kernels (forward and backward)
under the interpreter. Naive and flash start from the same init and see the same batches in fp32, so
their losses must agree step by step: that is what shows the flash backward pass trains.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "attention_ablation.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("attention_ablation", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    mod = _load_script()
    out = tmp_path_factory.mktemp("ablation")
    result = mod.main(["--cpu-tiny", "--out", str(out)])
    return mod, out, result


def test_outputs_written(tiny_run):
    mod, out, result = tiny_run
    stem = mod.STEM
    for ext in ("json", "md"):
        assert (out / f"{stem}.{ext}").stat().st_size > 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass  # the script documents that the plot needs matplotlib (nox installs it)
    else:
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    on_disk = json.loads((out / f"{stem}.json").read_text())
    assert on_disk["runs"] == json.loads(json.dumps(result["runs"]))
    for key in ("torch", "triton", "python", "gpu"):
        assert key in on_disk["env"]
    readme = (out / "README.md").read_text()
    start, end = readme.index(mod.MARK_START), readme.index(mod.MARK_END)
    section = readme[start:end]
    assert "| MQA | 1 | flash |" in section and "O(N*d)" in readme
    md = (out / f"{stem}.md").read_text()
    assert md.count("| GQA | 2 | naive |") == 2  # one PPL row and one timed-only row


def test_full_grid_and_finite_numbers(tiny_run):
    mod, _, result = tiny_run
    cfg = result["config"]
    runs = result["runs"]
    grid = {(r["layout"], r["impl"], r["seq_len"]) for r in runs}
    lengths = list(cfg["lengths"]) + list(cfg["long_lengths"])
    assert grid == {(lay, imp, n) for lay in ("mha", "gqa", "mqa") for imp in ("naive", "flash") for n in lengths}
    for r in runs:
        assert r["status"] == "ok", r
        assert len(r["train_losses"]) == r["steps"]
        assert all(math.isfinite(x) for x in r["train_losses"])
        assert math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0
        if r["kind"] == "train":
            assert math.isfinite(r["val_ppl"]) and 1.0 < r["val_ppl"] < 256.0
            # Training moved the weights: the loss of the last step differs from the first.
            assert r["train_losses"][-1] != r["train_losses"][0]


def test_flash_matches_naive_training(tiny_run):
    mod, _, result = tiny_run
    from flashattn_triton._common import interpreter_enabled

    # Under TRITON_INTERPRET=1 (nox) the flash rows ran the Triton kernels, not the torch fallback.
    assert result["env"]["flash_backend"] == ("interpreter" if interpreter_enabled() else "torch")
    by_key = {(r["layout"], r["impl"], r["seq_len"]): r for r in result["runs"]}
    for (layout, impl, n), naive in by_key.items():
        if impl != "naive":
            continue
        flash = by_key[(layout, "flash", n)]
        for a, b in zip(naive["train_losses"], flash["train_losses"], strict=True):
            assert abs(a - b) <= 1e-3 * abs(a), (layout, n, naive["train_losses"], flash["train_losses"])
        if "val_loss" in naive:
            assert abs(naive["val_loss"] - flash["val_loss"]) <= 1e-3 * naive["val_loss"]
    # The layouts really differ (different parameter counts -> different trajectories).
    assert (
        by_key[("mha", "naive", result["config"]["lengths"][0])]["train_losses"]
        != (by_key[("mqa", "naive", result["config"]["lengths"][0])]["train_losses"])
    )
