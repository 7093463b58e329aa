"""Sessions for llm-kernel-lib. `nox -l` lists them; README.md says which runs where.

tests        CPU: the four packages from local paths, torch 2.13.0 CPU, newest Triton,
             every test with TRITON_INTERPRET=1, plus the nvcc compile check of the
             CUDA extension. This is what CI runs.
tests_matrix the same over torch x Triton combinations installable here.
build        sdist + wheel per package into dist/, each kernel wheel installed ALONE
             in a fresh venv and imported, then the meta-package.
bench        benchmarks/run_all.py: the real suite on a CUDA machine, a labelled
             smoke pass (tiny sizes, interpreter) without one.
lint         ruff format --check + ruff check.
gpu          on a CUDA machine: GPU tests (-m gpu) + benchmarks.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"

ROOT = Path(__file__).resolve().parent
KERNEL_PACKAGES = {
    "flashattn-triton": "flashattn_triton",
    "int8-gemm": "int8_gemm",
    "fused-rmsnorm": "fused_rmsnorm",
}
META_PACKAGE = ("llmk-meta", "llm_kernels")
ALL_PATHS = [f"packages/{p}" for p in [*KERNEL_PACKAGES, META_PACKAGE[0]]]

TORCH_CPU = "torch==2.13.0"  # the CPU build that installs from local disk here
TEST_DEPS = [
    "pytest>=8",
    "transformers>=4.45",
    "matplotlib",
    # the extension's compile check and wheel-build tests
    "pybind11>=2.12",
    "nvidia-cutlass==4.2.0.0",
    "hatchling>=1.25",
]
# (torch, triton, numpy) combinations tested on CPU; triton 3.6's interpreter breaks with numpy >= 2.4.
MATRIX = [
    ("2.13.0", "3.6.0", "numpy<2.4"),
    ("2.13.0", "3.8.0", "numpy<2.4"),
    ("2.13.0", "3.9.0", "numpy"),
]


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def _install_packages(session: nox.Session, *, aot: bool) -> None:
    # Installs from local paths; the CUDA extension is compiled at install time only when asked
    # (tests compile it separately as a check, so installing stays fast on 2-core CI).
    env = {"FUSED_RMSNORM_BUILD": "1" if aot else "0"}
    session.install(*ALL_PATHS, env=env)


def _cpu_tests(session: nox.Session, torch: str, triton: str, numpy: str) -> None:
    session.install(f"torch=={torch}", f"triton=={triton}" if triton else "triton", numpy, *TEST_DEPS)
    _install_packages(session, aot=False)
    session.run("python", "-m", "pytest", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session
def tests(session: nox.Session) -> None:
    """CPU test suite (CI): interpreter-run kernels, torch paths, nvcc compile check; then the
    Triton packages once more without the interpreter, i.e. on the PyTorch fallback that a plain
    CPU install runs (~10 s)."""
    _cpu_tests(session, "2.13.0", "", "numpy")
    if not session.posargs:
        fallback = ["packages/flashattn-triton/tests", "packages/int8-gemm/tests"]
        session.run("python", "-m", "pytest", "-q", *fallback, env={"TRITON_INTERPRET": "0"})


@nox.session
@nox.parametrize("torch,triton,numpy", MATRIX, ids=[f"torch{t}-triton{tr}" for t, tr, _ in MATRIX])
def tests_matrix(session: nox.Session, torch: str, triton: str, numpy: str) -> None:
    """The CPU suite over a torch x Triton matrix; then the offline sm_90a compile checks of the Gluon
    kernels (they skip on Triton versions the kernels do not target, and under the interpreter)."""
    _cpu_tests(session, torch, triton, numpy)
    if not session.posargs:
        kernels = ["packages/flashattn-triton/tests", "packages/int8-gemm/tests"]
        session.run("python", "-m", "pytest", "-q", "-k", "offline", *kernels, env={"TRITON_INTERPRET": "0"})


@nox.session
def build(session: nox.Session) -> None:
    """Wheels + sdists into dist/; each kernel wheel must install and import alone."""
    session.install("build")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for path in ALL_PATHS:
        session.run("python", "-m", "build", "--outdir", str(dist), path)
    wheels = {p.name.split("-")[0]: p for p in dist.glob("*.whl")}
    session.log(f"wheels: {sorted(w.name for w in wheels.values())}")
    with tempfile.TemporaryDirectory() as tmp:
        for dist_name, module in [*KERNEL_PACKAGES.items(), META_PACKAGE]:
            wheel = wheels[dist_name.replace("-", "_")]
            venv = Path(tmp) / dist_name
            session.run("python", "-m", "venv", str(venv), external=True)
            py = str(venv / "bin" / "python")
            session.run(py, "-m", "pip", "install", "-q", TORCH_CPU, external=True)
            extra = ["--find-links", str(dist)] if module == META_PACKAGE[1] else []
            session.run(py, "-m", "pip", "install", "-q", *extra, str(wheel), external=True)
            others = [m for m in KERNEL_PACKAGES.values() if m != module]
            check = (
                "import importlib.util, sys;"
                f"m = __import__('{module}'); print('{dist_name}', m.__version__);"
                f"others = {others!r};"
                "present = [o for o in others if importlib.util.find_spec(o)];"
                f"sys.exit(0 if ('{module}' == 'llm_kernels' or not present) else f'not alone: {{present}}')"
            )
            session.run(py, "-c", check, external=True)


@nox.session(venv_params=["--system-site-packages"])
def bench(session: nox.Session) -> None:
    """The main job: benchmarks/run_all.py (smoke pass without a CUDA GPU)."""
    if _has_gpu():
        # Reuse the machine's CUDA build of torch (and its matching Triton) from the system site.
        session.install("matplotlib", "pybind11>=2.12", "nvidia-cutlass==4.2.0.0")
        _install_packages(session, aot=True)
        session.run("python", "benchmarks/run_all.py", "--plot", *session.posargs)
    else:
        session.install(TORCH_CPU, "triton", "numpy", "matplotlib")
        _install_packages(session, aot=False)
        session.run("python", "benchmarks/run_all.py", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session(venv_params=["--system-site-packages"])
def gpu(session: nox.Session) -> None:
    """On a CUDA machine: GPU tests (-m gpu) and the benchmark suite."""
    if not _has_gpu():
        session.error("the gpu session needs a CUDA machine (nvidia-smi not found)")
    session.install("pytest>=8", "matplotlib", "pybind11>=2.12", "nvidia-cutlass==4.2.0.0")
    _install_packages(session, aot=True)
    session.run("python", "-m", "pytest", "-m", "gpu", *session.posargs)
    session.run("python", "benchmarks/run_all.py", "--plot")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff format check + lint."""
    session.install("ruff")
    session.run("ruff", "format", "--check", ".")
    session.run("ruff", "check", ".")
