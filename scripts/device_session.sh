#!/usr/bin/env bash
# The maintainers' one-call GPU session (the lease allows one command of <= 10 min): build the
# extension while the GPU tests run, then SASS evidence, the three benchmark suites (each under
# its own time limit so one slow suite cannot cost the others), merged JSON, plots, roofline.
# Everything is packed into $OUT/results.tgz (the lease returns at most 8 files).
#   OUT=... STAGES=tests,tune,bench scripts/device_session.sh [TEST_PATHS...]
set -uo pipefail
OUT=${OUT:?OUT must be set}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
W=/tmp/llmk_out
rm -rf $W && mkdir -p $W
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/llmk_site .whl/*.whl
fi
export PYTHONPATH=/tmp/llmk_site:$ROOT/packages/flashattn-triton/src:$ROOT/packages/int8-gemm/src:$ROOT/packages/fused-rmsnorm/src:$ROOT/packages/llmk-meta/src
T0=$SECONDS
stage() { # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local t=$SECONDS
  timeout "$limit" "$@" >"$W/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc $((SECONDS - t))s (t=$((SECONDS - T0))s)" | tee -a $W/summary.txt
  tail -n 6 "$W/$name.log"
  tar czf $OUT/results.tgz -C $W . 2>/dev/null  # re-packed after every stage: a cut-off call keeps what ran
}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } > $W/env.txt 2>&1
cat $W/env.txt
FUSED_RMSNORM_CUDA_ARCH_LIST=9.0a timeout 150 python3 -m fused_rmsnorm._build --inplace > $W/build.log 2>&1 &
BUILD=$!
STAGES=${STAGES:-tests,tune,bench}
has() { case ",$STAGES," in *,$1,*) return 0 ;; esac; return 1; }
PYTEST=(python3 -m pytest -q -m gpu -p no:cacheprovider -o "addopts=--import-mode=importlib -ra")
if has tests; then
  stage gpu_tests_triton ${TEST_LIMIT:-110} "${PYTEST[@]}" ${@:-packages/int8-gemm/tests}
fi
BUILT=0
need_build() {  # the extension builds in the background until something needs it
  [ $BUILT = 1 ] && return
  wait $BUILD; echo "build rc=$? (t=$((SECONDS - T0))s)" | tee -a $W/summary.txt; tail -3 $W/build.log
  BUILT=1
}
if has tests; then
  need_build
  stage gpu_tests_rmsnorm ${RMS_TEST_LIMIT:-75} "${PYTEST[@]}" packages/fused-rmsnorm/tests
fi
if has tune; then
  stage tune_int8 ${TUNE_LIMIT:-110} python3 scripts/tune_int8.py $W --budget ${TUNE_BUDGET:-70}
  # later stages of this call use the fresh table
  [ -s $W/tuning_int8_gemm.json ] && cp $W/tuning_int8_gemm.json packages/int8-gemm/src/int8_gemm/tuning.json
fi
has sass && stage sass 40 python3 scripts/int8_sass.py
has bench || { need_build; tar czf $OUT/results.tgz -C $W .; cat $W/summary.txt; exit 0; }
export LLMK_BENCH_STREAM=$W/bench_stream.jsonl
for s in attention int8 rmsnorm; do
  [ $s = rmsnorm ] && need_build
  lim=${BENCH_LIMIT:-80}; [ $s = attention ] && lim=$((lim + 25))
  stage bench_$s $lim python3 benchmarks/run_all.py $s --json $W/bench_$s.json
done
unset LLMK_BENCH_STREAM
stage merge 30 python3 - <<'PY'
import json, sys
sys.path.insert(0, ".")
from benchmarks import harness, plots
recs = [json.loads(l) for l in open("/tmp/llmk_out/bench_stream.jsonl")]
out = f"/tmp/llmk_out/{harness.gpu_slug()}.json"
json.dump({"env": harness.env_info(), "smoke": False, "records": recs}, open(out, "w"), indent=1)
print(out, len(recs), [str(p) for p in plots.ratio_plots(out)])
PY
stage roofline 40 sh -c 'python3 benchmarks/roofline.py /tmp/llmk_out/*h200*.json --out /tmp/llmk_out'
if [ -n "${LATE_TESTS:-}" ]; then
  need_build  # slow GPU tests (JIT build, compute-sanitizer) go last
  stage gpu_tests_late ${LATE_LIMIT:-100} "${PYTEST[@]}" $LATE_TESTS
fi
need_build
tar czf $OUT/results.tgz -C $W .
cat $W/summary.txt
