"""The CUDA extension compiles with nvcc (CI has nvcc but no GPU): the --check path for the
configured arch list, the oldest-arch (no-GEMM) build, and the JIT cache/lock/load plumbing.

Cost on a 2-core CI runner: the CUTLASS units dominate, so the default-arch check uses --light
(one tile config and one dtype per GEMM family: the same template code paths; ~1-1.5 min); the
full build (~3 min wall on 2 cores) is what the wheel and JIT paths compile.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from fused_rmsnorm import _build

pytestmark = pytest.mark.skipif(_build.find_nvcc() is None, reason="nvcc not found: cannot compile the extension")

SRC = Path(_build.__file__).resolve().parent.parent
PKG_ROOT = Path(__file__).resolve().parents[1]  # packages/fused-rmsnorm (the wheel is built from here)


def _run_check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    env.pop("FUSED_RMSNORM_CUDA_ARCH_LIST", None)
    env.pop("TORCH_CUDA_ARCH_LIST", None)
    cmd = [sys.executable, "-m", "fused_rmsnorm._build", "--check", "--out", str(tmp_path), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)


def _load(tmp_path: Path):
    (so,) = list(tmp_path.glob("_C*.so"))
    return _build.load_module(so, name=f"frms_test_{tmp_path.name}._C")


def test_check_configured_arch_list(tmp_path):
    if _build.cutlass_include() is None:
        pytest.fail("CUTLASS headers not found: install nvidia-cutlass (a build dependency) or set CUTLASS_PATH")
    res = _run_check(tmp_path, "--light")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "check OK" in res.stdout
    for unit in ("decode", "decode_mma", "rstd", "gemm_sm80", "gemm_sm90_light", "binding"):
        assert f"compiled {unit}" in res.stdout, res.stdout
    mod = _load(tmp_path)  # importable without a GPU (static cudart, no CUDA call at import)
    assert list(mod.compiled_archs()) == _build.resolve_arch_list(_build.default_arch_list())
    assert mod.has_sm90_gemm() and mod.has_sm80_gemm() and mod.has_decode_mma()
    assert mod.cuda_version() >= 12000
    assert mod.source_hash() == _build.source_hash()  # what backend.aot_staleness compares


def _pip_wheel(out: Path, **env_extra: str) -> Path:
    if importlib.util.find_spec("hatchling") is None:
        pytest.skip("hatchling is not installed: cannot build the wheel")
    env = dict(os.environ, **env_extra)
    env.pop("TORCH_CUDA_ARCH_LIST", None)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-build-isolation",
        "--no-deps",
        str(PKG_ROOT),
        "-w",
        str(out),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    assert res.returncode == 0, res.stdout + res.stderr
    (whl,) = out.glob("fused_rmsnorm-*.whl")
    return whl


def test_oldest_arch_aot_wheel_without_gemm(tmp_path):
    """The seed's V100 build (7.0) has decode + rstd only. nvcc 13 dropped sm_70, so there the build
    must refuse with a clear message, and the same no-GEMM configuration is built for 7.5 -- through
    the hatchling hook, i.e. the AOT wheel path (platform-tagged wheel with _C inside)."""
    nvcc = _build.find_nvcc()
    codes = _build.nvcc_supported_codes(nvcc)
    if not codes or "sm_70" in codes:
        arch = "7.0"
    else:
        with pytest.raises(_build.BuildError, match="CUDA 12"):
            _build.plan(["7.0"], nvcc=nvcc)
        arch = "7.5"
    whl = _pip_wheel(tmp_path / "wheel", FUSED_RMSNORM_CUDA_ARCH_LIST=arch)
    assert "-none-any" not in whl.name, whl.name
    with zipfile.ZipFile(whl) as z:
        (so,) = [n for n in z.namelist() if n.startswith("fused_rmsnorm/_C") and n.endswith(".so")]
        z.extract(so, tmp_path / "x")
    mod = _build.load_module(tmp_path / "x" / so, name="frms_test_oldest._C")
    assert list(mod.compiled_archs()) == [arch]
    assert not mod.has_sm90_gemm() and not mod.has_sm80_gemm()
    assert not mod.has_decode_mma()  # mma.sync bf16 needs sm_80: the unit is not compiled at all


def test_jit_only_wheel_ships_sources(tmp_path):
    whl = _pip_wheel(tmp_path, FUSED_RMSNORM_BUILD="0")
    assert whl.name.endswith("-py3-none-any.whl"), whl.name
    names = set(zipfile.ZipFile(whl).namelist())
    for f in (
        "decode.cu",
        "decode_mma.cu",
        "rstd.cu",
        "gemm_sm90.cu",
        "gemm_sm80.cu",
        "binding.cpp",
        "frms.h",
        "vec.cuh",
    ):
        assert f"fused_rmsnorm/csrc/{f}" in names
    assert "fused_rmsnorm/_common/checks.py" in names and "fused_rmsnorm/build_config.json" in names
    assert not any(n.endswith(".so") for n in names)
    # the installed sources hash as the tree a build compiled: no wheel user sees a false "stale AOT" warning
    zipfile.ZipFile(whl).extractall(tmp_path / "x")
    spec = importlib.util.spec_from_file_location("frms_wheel_build", tmp_path / "x" / "fused_rmsnorm" / "_build.py")
    installed = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = installed  # its dataclasses need the module registered
    try:
        spec.loader.exec_module(installed)
        assert installed.CSRC != _build.CSRC and installed.source_hash() == _build.source_hash()
    finally:
        del sys.modules[spec.name]


def test_jit_cache_build_lock_and_reuse(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSED_RMSNORM_CACHE", str(tmp_path))
    nvcc = _build.find_nvcc()
    arch = "7.5"  # cheapest arch (no CUTLASS units): exercises the plumbing, not the kernels
    key = _build.jit_key([arch], nvcc)
    assert key != _build.jit_key(["8.6"], nvcc)
    path = _build.jit_build([arch])
    assert path.parent == tmp_path / key and path.is_file()
    mtime = path.stat().st_mtime_ns
    t0 = time.perf_counter()
    assert _build.jit_build([arch]) == path  # cached: no rebuild
    assert time.perf_counter() - t0 < 5 and path.stat().st_mtime_ns == mtime
    mod = _build.load_module(path, name="frms_test_jit._C")
    assert list(mod.compiled_archs()) == [arch] and mod.source_hash() == _build.source_hash()
    with pytest.raises(RuntimeError, match="gemm_sm90.*not compiled"):
        mod.gemm_sm90(0, 0, 0, 8, 0, 8, 0, 0, 0, 8, 8, 8, 8, False, 0)
