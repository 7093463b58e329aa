"""The one build implementation of the CUDA extension ``fused_rmsnorm._C``.

Used by
* ``hatch_build.py`` (AOT: compiled into the wheel when nvcc is found),
* the JIT path (``jit_load``: compiled at first use into ``~/.cache/fused_rmsnorm/<key>/``),
* ``python -m fused_rmsnorm._build --inplace [--arch LIST]`` (build next to this file) and
  ``python -m fused_rmsnorm._build --check [--arch LIST] [--out DIR] [--light]`` (CI compile check).

Deliberately free of torch imports: the build hook runs it in a bare build environment.

Translation units (each one nvcc process, run in parallel up to os.cpu_count()):
* ``decode.cu``, ``rstd.cu``: every arch in the list (plain CUDA, sm_70+), plus PTX of the newest;
* ``decode_mma.cu``, ``decode_stream.cu``: the tensor-core decode kernels (mma.sync bf16 needs sm_80):
  every arch >= 8.0 in the list plus PTX of the newest; skipped (binding reports ``has_decode_mma() ==
  False``) when the list has none;
* ``gemm_sm80.cu``: CUTLASS 2.x, compiled for sm_80 only when any 8.x arch is requested (the sm_80
  cubin runs on sm_86 / sm_89);
* ``gemm_sm90.cu`` x 15 tile configs (one unit each): CUTLASS 3.x, ``sm_90a`` only (plain sm_90 builds stubs);
* ``binding.cpp``: pybind11, told by macros which GEMMs exist and the ``source_hash()`` of what it was built from.
The CUTLASS units are skipped (prefill then uses the torch GEMM) when the CUTLASS headers are absent.

Cost on 2 CPU cores (nvcc 13.0): the full default-arch build is ~5.3 CPU-minutes (each SM90 tile
config ~55-70 CPU-s for bf16+fp16, the SM80 GEMMs ~40 CPU-s, decode+rstd for 4 archs ~25 CPU-s,
decode_mma ~25-30 CPU-s per arch with its tuning variants, binding ~15 CPU-s), i.e. about 4 minutes
wall with the three original SM90 configs. The four added in session 4 (64x128 ping-pong cluster 2,
128x128 coop cluster 2, 256x128 coop cluster 2, 128x128 coop stream-K) measured ~65 CPU-s for bf16
alone (the stream-K unit, a busy 2-core box), so up to ~2 CPU-minutes per config for both dtypes: up
to ~8 CPU-minutes more, a minute or two more wall on a 16-core GPU host (units run in parallel).
``--check --light`` instantiates one tile config and one dtype per GEMM family and decode_mma for the
oldest and newest 8.0+ arch only, its (steps, ldpolicy) variants for bf16 and 8 tokens only (the same
template code paths) for CI; its module is only a compile proof.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PKG_DIR = Path(__file__).resolve().parent
CSRC = PKG_DIR / "csrc"
CONFIG_FILE = PKG_DIR / "build_config.json"
MODULE_NAME = "_C"
SM90_CONFIGS = tuple(range(15))  # FRMS_SM90_NUM_CONFIGS in csrc/frms.h
SM90_LIGHT_CONFIGS = (2, 7, 11, 12)  # --light: one per family (plain 0-6, swap-AB 7-10, self rstd 11, basic 12-14)


class BuildError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------- tools


def find_nvcc() -> str | None:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1]


def nvcc_supported_codes(nvcc: str) -> set[str]:
    """{'sm_75', 'sm_80', ...}; empty if this nvcc cannot list them (then nothing is pre-rejected)."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, check=True).stdout
    except (subprocess.CalledProcessError, OSError):
        return set()
    return set(out.split())


def cutlass_include() -> Path | None:
    """CUTLASS headers: $CUTLASS_PATH(/include) or the ``nvidia-cutlass`` package's copy."""
    env = os.environ.get("CUTLASS_PATH")
    if env:
        for cand in (Path(env) / "include", Path(env)):
            if (cand / "cutlass" / "cutlass.h").is_file():
                return cand
    try:
        import cutlass_library  # the nvidia-cutlass wheel ships the headers inside it
    except ImportError:
        return None
    cand = Path(cutlass_library.__file__).resolve().parent / "source" / "include"
    return cand if (cand / "cutlass" / "cutlass.h").is_file() else None


def pybind11_include() -> str:
    try:
        import pybind11
    except ImportError as e:
        raise BuildError("pybind11 is required to build fused_rmsnorm._C (pip install pybind11)") from e
    return pybind11.get_include()


def ext_suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


# ---------------------------------------------------------------------------------------------- arch


def default_arch_list() -> str:
    with open(CONFIG_FILE) as f:
        return json.load(f)["cuda_arch_list"]


def resolve_arch_list(explicit: str | None = None) -> list[str]:
    """Arch list: explicit > FUSED_RMSNORM_CUDA_ARCH_LIST > TORCH_CUDA_ARCH_LIST > build_config.json."""
    raw = (
        explicit
        or os.environ.get("FUSED_RMSNORM_CUDA_ARCH_LIST")
        or os.environ.get("TORCH_CUDA_ARCH_LIST")
        or default_arch_list()
    )
    archs = []
    for tok in re.split(r"[;,\s]+", raw.strip()):
        if not tok:
            continue
        m = re.fullmatch(r"(\d+)\.(\d+)(a?)(\+PTX)?", tok, flags=re.IGNORECASE)
        if not m:
            raise BuildError(f"bad CUDA arch {tok!r} in arch list {raw!r} (expected e.g. '8.6', '9.0a', '8.0+PTX')")
        archs.append(f"{m.group(1)}.{m.group(2)}{m.group(3).lower()}{'+PTX' if m.group(4) else ''}")
    if not archs:
        raise BuildError(f"empty CUDA arch list {raw!r}")
    return archs


def _num(arch: str) -> str:
    return arch.replace("+PTX", "").replace(".", "")  # '9.0a' -> '90a'


def _major(arch: str) -> int:
    return int(arch.split(".")[0])


def _check_supported(archs: list[str], supported: set[str], version: str) -> None:
    if not supported:
        return
    for a in archs:
        code = "sm_" + _num(a).rstrip("a")
        if code not in supported:
            hint = ""
            if _major(a) < 7 or a.startswith(("7.0", "7.2")):
                hint = " (CUDA 13 removed Volta/sm_70 and older: build a V100 extension with a CUDA 12.x nvcc)"
            raise BuildError(f"nvcc {version} cannot compile for arch {a}{hint}; it supports {sorted(supported)}")


# --------------------------------------------------------------------------------------------- plan


@dataclass
class Unit:
    name: str
    source: Path
    flags: list[str] = field(default_factory=list)


@dataclass
class Plan:
    archs: list[str]
    units: list[Unit]
    have_sm80: bool
    have_sm90: bool
    have_mma: bool
    cutlass: Path | None
    nvcc: str
    version: str


def plan(archs: list[str], *, nvcc: str, light: bool = False, use_cutlass: bool = True) -> Plan:
    version = nvcc_version(nvcc)
    _check_supported(archs, nvcc_supported_codes(nvcc), version)
    cutlass = cutlass_include() if use_cutlass else None

    plain = []  # gencodes for decode / rstd
    for a in archs:
        n = _num(a)
        plain.append(f"-gencode=arch=compute_{n},code=sm_{n}")
    newest = max(archs, key=lambda a: (_major(a), int(_num(a)[-1].rstrip("a") or 0), a))
    n_newest = _num(newest).rstrip("a")
    plain.append(f"-gencode=arch=compute_{n_newest},code=compute_{n_newest}")  # PTX for newer GPUs
    for a in archs:
        if a.endswith("+PTX") and _num(a) != n_newest:
            plain.append(f"-gencode=arch=compute_{_num(a)},code=compute_{_num(a)}")

    mma_archs = [a for a in archs if _major(a) >= 8]
    if light and len(mma_archs) > 2:  # both sides of the kernel's sm_90 (cluster) #if
        mma_archs = [mma_archs[0], mma_archs[-1]]
    wgmma = any(_num(a) == "90a" for a in mma_archs)  # decode_stream's wgmma kernel: an sm_90a cubin
    mma = [f"-gencode=arch=compute_{_num(a)},code=sm_{_num(a)}" for a in mma_archs]
    if mma_archs:
        mma.append(f"-gencode=arch=compute_{n_newest},code=compute_{n_newest}")
    light_mma = ["-DFRMS_MMA_LIGHT"] if light else []  # the (steps, ldpolicy) variants for bf16, 8 tokens
    mma += light_mma
    have_sm80 = cutlass is not None and any(_major(a) == 8 for a in archs)
    have_sm90 = cutlass is not None and any(_major(a) == 9 for a in archs)
    units = [Unit("decode", CSRC / "decode.cu", plain), Unit("rstd", CSRC / "rstd.cu", plain)]
    if mma_archs:
        units.append(Unit("decode_mma", CSRC / "decode_mma.cu", mma))
        units.append(Unit("decode_stream", CSRC / "decode_stream.cu", [*mma, f"-DFRMS_STREAM_WGMMA={int(wgmma)}"]))
    cut = [f"-I{cutlass}"] if cutlass else []
    if have_sm80:
        sm80 = ["-gencode=arch=compute_80,code=sm_80", *cut] + (["-DFRMS_SM80_LIGHT"] if light else [])
        units.append(Unit("gemm_sm80", CSRC / "gemm_sm80.cu", sm80))
    if have_sm90:
        # no CUTLASS_ENABLE_GDC_FOR_SM90: the PDL wait is in our epilogue node (see gemm_sm90.cu)
        sm90 = ["-gencode=arch=compute_90a,code=sm_90a", *cut]
        if light:
            # CI check: compile the smallest tile config for real; its unit also defines the other
            # entry points as forwarders so the module links (every template path still compiles once).
            for c in SM90_LIGHT_CONFIGS:
                flags = [*sm90, f"-DFRMS_SM90_CFG={c}", "-DFRMS_SM90_LIGHT"]
                units.append(Unit(f"gemm_sm90_light{c}", CSRC / "gemm_sm90.cu", flags))
        else:
            for c in SM90_CONFIGS:
                units.append(Unit(f"gemm_sm90_cfg{c}", CSRC / "gemm_sm90.cu", [*sm90, f"-DFRMS_SM90_CFG={c}"]))
    arch_str = ";".join(archs)
    units.append(
        Unit(
            "binding",
            CSRC / "binding.cpp",
            [
                f"-I{pybind11_include()}",
                f"-I{sysconfig.get_paths()['include']}",
                f"-DFRMS_HAVE_SM80={int(have_sm80)}",
                f"-DFRMS_HAVE_SM90={int(have_sm90)}",
                f"-DFRMS_HAVE_MMA={int(bool(mma_archs))}",
                f"-DFRMS_STREAM_WGMMA={int(wgmma)}",
                *light_mma,
                f'-DFRMS_ARCHS="{arch_str}"',
                f'-DFRMS_SOURCE_HASH="{source_hash()}"',  # backend.py warns when the installed sources differ
                "-Xcompiler=-fvisibility=hidden",
            ],
        )
    )
    return Plan(archs, units, have_sm80, have_sm90, bool(mma_archs), cutlass, nvcc, version)


COMMON = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-DNDEBUG", "-Xcompiler=-fPIC", f"-I{CSRC}"]


def _compile(nvcc: str, unit: Unit, obj: Path) -> tuple[str, float, str]:
    cmd = [nvcc, "-c", str(unit.source), "-o", str(obj), *COMMON, *unit.flags]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise BuildError(f"nvcc failed for {unit.name} ({dt:.0f}s):\n{' '.join(cmd)}\n{res.stdout}{res.stderr}")
    return unit.name, dt, res.stderr


def build(
    out_dir: Path,
    archs: list[str],
    *,
    nvcc: str | None = None,
    jobs: int | None = None,
    light: bool = False,
    verbose: bool = True,
    use_cutlass: bool = True,
) -> Path:
    """Compile every unit in parallel and link ``_C<EXT_SUFFIX>`` into ``out_dir``; returns its path."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    p = plan(archs, nvcc=nvcc, light=light, use_cutlass=use_cutlass)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = (lambda s: print(s, flush=True)) if verbose else (lambda s: None)
    log(
        f"[fused_rmsnorm build] nvcc {p.version}, archs {';'.join(archs)}, cutlass {p.cutlass or 'NOT FOUND'}, "
        f"sm80 gemm {p.have_sm80}, sm90 gemm {p.have_sm90}, decode_mma {p.have_mma}, {len(p.units)} units"
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="frms_build_") as tmp:
        objs = {u.name: Path(tmp) / f"{u.name}.o" for u in p.units}
        workers = max(1, min(jobs or os.cpu_count() or 1, len(p.units)))
        # longest first so the CUTLASS units start immediately
        order = sorted(p.units, key=lambda u: 0 if u.name.startswith("gemm") else 1)
        with cf.ThreadPoolExecutor(workers) as ex:
            futs = [ex.submit(_compile, nvcc, u, objs[u.name]) for u in order]
            for fut in cf.as_completed(futs):
                name, dt, _ = fut.result()
                log(f"  compiled {name:<16} {dt:6.1f}s")
        target = out_dir / f"{MODULE_NAME}{ext_suffix()}"
        tmp_target = Path(tmp) / target.name
        link = [nvcc, "-shared", "-cudart=static", "-o", str(tmp_target), *map(str, objs.values())]
        res = subprocess.run(link, capture_output=True, text=True)
        if res.returncode != 0:
            raise BuildError(f"link failed:\n{' '.join(link)}\n{res.stdout}{res.stderr}")
        # copy next to the target, then rename: other processes never see a half-written module
        staged = out_dir / f".{target.name}.{os.getpid()}.tmp"
        shutil.copy2(tmp_target, staged)
        os.replace(staged, target)
    log(f"[fused_rmsnorm build] linked {target} in {time.perf_counter() - t0:.1f}s total")
    return target


# ---------------------------------------------------------------------------------------------- JIT


def cache_root() -> Path:
    env = os.environ.get("FUSED_RMSNORM_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fused_rmsnorm"


def source_hash() -> str:
    """sha256 of csrc/ and this file: the JIT cache key's first part and the hash compiled into every module."""
    h = hashlib.sha256()
    for f in sorted(CSRC.iterdir()):
        if f.suffix in (".cu", ".cuh", ".cpp", ".h"):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    h.update(Path(__file__).read_bytes())  # build flags live here
    return h.hexdigest()


def jit_key(archs: list[str], nvcc: str) -> str:
    cut = cutlass_include()
    parts = [
        source_hash(),
        ";".join(archs),
        nvcc_version(nvcc),
        sys.implementation.cache_tag or "",
        ext_suffix(),
        str(cut) if cut else "no-cutlass",
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


@contextlib.contextmanager
def _file_lock(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # other processes building the same key wait here
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def jit_build(archs: list[str], *, verbose: bool = False) -> Path:
    """Build (once, under a file lock) into the cache; returns the module path."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found: the JIT path needs the CUDA toolkit (set CUDA_HOME)")
    d = cache_root() / jit_key(archs, nvcc)
    target = d / f"{MODULE_NAME}{ext_suffix()}"
    if target.is_file():
        return target
    with _file_lock(d / "lock"):
        if not target.is_file():  # another process may have finished it while we waited
            build(d, archs, nvcc=nvcc, verbose=verbose)
    return target


def load_module(path: Path, name: str = "fused_rmsnorm._jit._C"):
    """Import an extension file under a private name (its init symbol is PyInit__C either way)."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fused_rmsnorm._build", description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--inplace", action="store_true", help="build _C next to this file (the AOT module)")
    mode.add_argument("--check", action="store_true", help="compile every unit and link into --out (CI)")
    ap.add_argument("--arch", help="arch list, e.g. '8.6;9.0a' (default: env / build_config.json)")
    ap.add_argument("--out", help="output dir for --check (default: a temp dir, deleted)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: cpu count)")
    ap.add_argument(
        "--light",
        action="store_true",
        help="--check: one tile config + one dtype per GEMM family (CI; the module is not for use)",
    )
    ap.add_argument("--no-cutlass", action="store_true", help="skip the CUTLASS GEMM units")
    args = ap.parse_args(argv)
    try:
        archs = resolve_arch_list(args.arch)
        if args.inplace:
            build(PKG_DIR, archs, jobs=args.jobs, use_cutlass=not args.no_cutlass)
        else:
            with contextlib.ExitStack() as stack:
                out = Path(args.out) if args.out else Path(stack.enter_context(tempfile.TemporaryDirectory()))
                target = build(out, archs, jobs=args.jobs, light=args.light, use_cutlass=not args.no_cutlass)
                print(f"[fused_rmsnorm build] check OK: {target.name} ({target.stat().st_size / 1e6:.1f} MB)")
    except BuildError as e:
        print(f"[fused_rmsnorm build] FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
