#!/usr/bin/env bash
# GPU runner for a bare CUDA machine that has torch + triton but no network, nox or hatchling.
#   scripts/gpu_run.sh OUTDIR [--quick] [--no-bench] [--no-tests] [--tune]
# Puts the packages' src dirs on PYTHONPATH, builds the CUDA extension in place, runs the GPU
# tests (-m gpu) and the benchmarks, and writes logs + JSON into OUTDIR.
# Optional extra Python packages (e.g. CUTLASS headers) can be carried as wheels in .whl/.
set -uo pipefail
OUT=${1:?usage: scripts/gpu_run.sh OUTDIR [--quick] [--no-bench] [--no-tests] [--tune]}
shift
QUICK=""; BENCH=1; TESTS=1; TUNE=0
for a in "$@"; do
  case $a in
    --quick) QUICK=--quick ;;
    --no-bench) BENCH=0 ;;
    --no-tests) TESTS=0 ;;
    --tune) TUNE=1 ;;
    *) echo "unknown option $a"; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/llmk_site .whl/*.whl
  export PYTHONPATH=/tmp/llmk_site${PYTHONPATH:+:$PYTHONPATH}
fi
for p in flashattn-triton int8-gemm fused-rmsnorm llmk-meta; do
  PYTHONPATH=$ROOT/packages/$p/src:$PYTHONPATH
done
export PYTHONPATH
status=0
step() { # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || status=1
  tail -n 15 "$OUT/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/env.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" >> "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
step build python3 -m fused_rmsnorm._build --inplace
if [ $TESTS = 1 ]; then
  step gpu_tests python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/junit.xml"
fi
if [ $TUNE = 1 ]; then
  for t in scripts/tune_*.py; do
    step "$(basename "$t" .py)" python3 "$t" "$OUT"
  done
fi
if [ $BENCH = 1 ]; then
  step bench python3 benchmarks/run_all.py $QUICK --json "$OUT/bench.json" --plot
fi
cat "$OUT/summary.txt"
exit $status
