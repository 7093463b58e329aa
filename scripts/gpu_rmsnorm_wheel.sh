#!/usr/bin/env bash
# fused-rmsnorm packaging check on the GPU machine (for the lead):
#   scripts/gpu_rmsnorm_wheel.sh OUTDIR [build|test|all]
# AOT_TEST_K narrows the AOT install's GPU tests (pytest -k) when time is short.
# `build` does the CPU-only part (both wheels built and installed, and the JIT-only install's first
# use, which compiles into OUTDIR/jit_cache), so a runner can overlap it with GPU work; `test` then
# runs the GPU tests against the two installs; `all` (default) does both.
# 1. AOT: builds the wheel with the extension inside (arch 9.0a only, for time: ~1-2 min on 16 cores),
#    installs it into OUTDIR/site_aot and runs the GPU tests against the INSTALLED package with
#    FUSED_RMSNORM_BACKEND=aot (the repo's src/ is not on the path).
# 2. JIT: builds a JIT-only wheel (FUSED_RMSNORM_BUILD=0), installs it into OUTDIR/site_jit and runs a
#    GPU test subset with FUSED_RMSNORM_BACKEND=jit: the first call compiles into OUTDIR/jit_cache.
# Needs hatchling, pybind11 and nvidia-cutlass importable: wheels installed to $LLMK_SITE (default
# /tmp/llmk_site, where scripts/gpu_run.sh puts the carried .whl/ files).
set -uo pipefail
OUT=${1:?usage: scripts/gpu_rmsnorm_wheel.sh OUTDIR [build|test|all]}
PHASE=${2:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
export PYTHONUNBUFFERED=1
BASE_PP=${LLMK_SITE:-/tmp/llmk_site}${PYTHONPATH:+:$PYTHONPATH}
status=0
step() { # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || status=1
  tail -n 12 "$OUT/$name.log"
}
export FUSED_RMSNORM_CACHE="$OUT/jit_cache"
if [ "$PHASE" != test ]; then
rm -rf "$OUT"/wheel_aot "$OUT"/wheel_jit "$OUT"/site_aot "$OUT"/site_jit "$OUT"/jit_cache

# --- 1. AOT wheel ---------------------------------------------------------------------------
step wheel_aot env PYTHONPATH="$BASE_PP" FUSED_RMSNORM_CUDA_ARCH_LIST=9.0a \
  python3 -m pip wheel --no-build-isolation --no-deps packages/fused-rmsnorm -w "$OUT/wheel_aot"
step install_aot python3 -m pip install --no-deps --no-index --no-compile --target "$OUT/site_aot" "$OUT"/wheel_aot/*.whl
step contents_aot python3 - "$OUT" <<'PY'
import glob, sys, zipfile
(whl,) = glob.glob(sys.argv[1] + "/wheel_aot/*.whl")
names = zipfile.ZipFile(whl).namelist()
so = [n for n in names if n.startswith("fused_rmsnorm/_C") and n.endswith(".so")]
src = [n for n in names if n.startswith("fused_rmsnorm/csrc/")]
print(whl, "\n  extension:", so, "\n  csrc files:", len(src))
assert so and src and "-none-any" not in whl, "AOT wheel must carry _C and be platform-specific"
PY
step wheel_jit env PYTHONPATH="$BASE_PP" FUSED_RMSNORM_BUILD=0 \
  python3 -m pip wheel --no-build-isolation --no-deps packages/fused-rmsnorm -w "$OUT/wheel_jit"
step install_jit python3 -m pip install --no-deps --no-index --no-compile --target "$OUT/site_jit" "$OUT"/wheel_jit/*.whl
# first use of the JIT-only install: compiles the extension with nvcc into the cache (CPU only)
step jit_build env PYTHONPATH="$OUT/site_jit:$BASE_PP" FUSED_RMSNORM_BACKEND=jit python3 -c "
import glob, os, time, fused_rmsnorm
from fused_rmsnorm import backend, _build
d = os.path.dirname(fused_rmsnorm.__file__)
assert 'site_jit' in d and not glob.glob(d + '/_C*.so'), d
t = time.time(); ext = backend._try_jit((9, 0)); print('jit:', ext, f'{time.time() - t:.1f}s')
assert ext.kind == 'jit', ext
"
fi
[ "$PHASE" = build ] && { cat "$OUT/summary.txt"; exit $status; }

aot_tests() {
  env PYTHONPATH="$OUT/site_aot:$BASE_PP" python3 -c \
    "import fused_rmsnorm; print(fused_rmsnorm.__file__); assert 'site_aot' in fused_rmsnorm.__file__" || return 1
  env PYTHONPATH="$OUT/site_aot:$BASE_PP" FUSED_RMSNORM_BACKEND=aot \
    python3 -m pytest packages/fused-rmsnorm/tests -m gpu -q -p no:cacheprovider --junitxml="$OUT/junit_aot.xml" \
    ${AOT_TEST_K:+-k "$AOT_TEST_K"}
}
step tests_aot aot_tests

# --- 2. JIT-only wheel ----------------------------------------------------------------------
jit_tests() {
  env PYTHONPATH="$OUT/site_jit:$BASE_PP" python3 -c \
    "import fused_rmsnorm, glob, os; d = os.path.dirname(fused_rmsnorm.__file__); print(d); assert 'site_jit' in d and not glob.glob(d + '/_C*.so')" || return 1
  env PYTHONPATH="$OUT/site_jit:$BASE_PP" FUSED_RMSNORM_BACKEND=jit \
    python3 -m pytest packages/fused-rmsnorm/tests -m gpu -q -p no:cacheprovider --junitxml="$OUT/junit_jit.xml" \
    -k "gpu_vs_fp32 and (4096 or 5120) or reports_extension or module"
}
step tests_jit jit_tests
ls -la "$OUT/jit_cache"/* 2>/dev/null | head
cat "$OUT/summary.txt"
exit $status
