#!/usr/bin/env bash
# GPU runner for a bare CUDA machine that has torch + triton but no network, nox or hatchling.
#
#   scripts/gpu_run.sh OUTDIR [--stages tests,bench] [--quick] [--pack FILE] [PYTEST_PATHS...]
#
# Stages (run in this order, any subset; probes first, as most need no extension build):
#   probe  each script in $PROBES (space-separated PATH[:BUDGET[:ARGS]]) as
#          `python3 PATH OUTDIR/NAME [--budget B] [ARGS with commas as spaces]`
#          (APPLY merges their tuning fragments into the packages' tables, see below)
#   tests  the GPU test suite (pytest -m gpu) over PYTEST_PATHS (default: every package + tests/);
#          TESTS_PARALLEL=1 runs one pytest per path concurrently (paths only; pytest options for
#          every part in TEST_ARGS)
#   tune   scripts/tune_int8.py; later stages of the same run use the fresh table
#   tune_rmsnorm  scripts/tune_rmsnorm.py (fused_rmsnorm kernel per M); the fresh table is used too
#   sass   scripts/int8_sass.py: instruction mix of the int8 kernels from their cubins
#   bench  benchmarks/run_all.py per suite (BENCH_SUITES, default all three), merged into
#          OUTDIR/<gpu>.json + plots + roofline
#   late   slow GPU tests named by $LATE_TESTS (JIT build, compute-sanitizer)
#   wheel  scripts/gpu_rmsnorm_wheel.sh: AOT wheel + JIT-only wheel built (in the background from the
#          start), installed and GPU-tested (at the end)
# Puts the packages' src dirs on PYTHONPATH, builds the CUDA extension in place (in the
# background while the Triton stages run; NO_BUILD=1 skips it), writes logs + JSON into OUTDIR. Wheels in .whl/
# (e.g. the CUTLASS headers, nvidia-cutlass) are installed to /tmp/llmk_site first. Each stage
# has a time limit (STAGE_LIMIT, or TESTS_LIMIT / BENCH_LIMIT / ...), so one slow stage cannot
# starve the rest; --pack FILE re-packs OUTDIR into FILE after every stage, so a run cut off
# from outside still returns what finished.
set -uo pipefail
W=${1:?usage: scripts/gpu_run.sh OUTDIR [--stages LIST] [--quick] [--pack FILE] [PYTEST_PATHS...]}
shift
STAGES=tests,bench; QUICK=""; PACK=""; PATHS=()
while [ $# -gt 0 ]; do
  case $1 in
    --stages) STAGES=$2; shift ;;
    --quick) QUICK=--quick ;;
    --pack) PACK=$2; shift ;;
    --*) echo "unknown option $1"; exit 2 ;;
    *) PATHS+=("$1") ;;
  esac
  shift
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
mkdir -p "$W"
W=$(cd "$W" && pwd)
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/llmk_site .whl/*.whl
fi
export PYTHONPATH=/tmp/llmk_site:$ROOT/packages/flashattn-triton/src:$ROOT/packages/int8-gemm/src:$ROOT/packages/fused-rmsnorm/src:$ROOT/packages/llmk-meta/src${PYTHONPATH:+:$PYTHONPATH}
LIMIT=${STAGE_LIMIT:-3600}
T0=$SECONDS
status=0
pack() { [ -n "$PACK" ] && tar czf "$PACK" -C "$W" . 2>/dev/null; return 0; }
stage() { # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local t=$SECONDS
  timeout "$limit" "$@" >"$W/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc $((SECONDS - t))s (t=$((SECONDS - T0))s)" | tee -a "$W/summary.txt"
  [ $rc -eq 0 ] || status=1
  tail -n 6 "$W/$name.log"
  pack
}
has() { case ",$STAGES," in *,$1,*) return 0 ;; esac; return 1; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } > "$W/env.txt" 2>&1
cat "$W/env.txt"
# NO_BUILD=1: no extension build (Triton-only runs). Killing the build early is no substitute: timeout
# stops the python driver, and its nvcc jobs keep every core busy for another minute (a benchmark
# started meanwhile measures host-bound cases on a loaded CPU).
BUILT=0
if [ -n "${NO_BUILD:-}" ]; then
  BUILT=1
  echo "build: skipped (NO_BUILD)" | tee -a "$W/summary.txt"
else
  timeout "${BUILD_LIMIT:-$LIMIT}" python3 -m fused_rmsnorm._build --inplace > "$W/build.log" 2>&1 &
  BUILD=$!
fi
if has wheel; then  # the wheel builds (CPU only) overlap the GPU stages; their tests run last
  bash scripts/gpu_rmsnorm_wheel.sh /tmp/llmk_wheel build > "$W/wheel_build.log" 2>&1 &
  WHEEL_BUILD=$!
fi
need_build() {  # the extension builds in the background until something needs it
  [ $BUILT = 1 ] && return
  wait $BUILD; local rc=$?
  echo "build: rc=$rc (t=$((SECONDS - T0))s)" | tee -a "$W/summary.txt"; tail -3 "$W/build.log"
  [ $rc -eq 0 ] || status=1
  BUILT=1
}
PYTEST=(python3 -m pytest -q -m gpu -p no:cacheprovider -o "addopts=--import-mode=importlib -ra")
if has probe; then  # only fused-rmsnorm probes wait for the extension build
  for spec in ${PROBES:-}; do  # PATH[:BUDGET_SECONDS[:ARGS]] (--budget B; ARGS comma-separated, e.g. --set,pf)
    IFS=: read -r p pb pa <<< "$spec"; n=$(basename "$p" .py); b=()
    [ -n "$pb" ] && b=(--budget "$pb")
    [ -n "$pa" ] && { IFS=, read -r -a xa <<< "$pa"; b+=("${xa[@]}"); }
    case $n in *rmsnorm*) need_build ;; esac
    stage "$n" "${PROBE_LIMIT:-$LIMIT}" python3 "$p" "$W/$n" "${b[@]}"
  done
  # APPLY="FRAGMENT=TUNING ...": merge each probe's (correctness-gated) winners into a package's
  # tuning.json before the later stages run; FRAGMENT is relative to OUTDIR, TUNING to the repo.
  # The merged tables are copied to OUTDIR/applied/ so they can be committed with the results.
  for pair in ${APPLY:-}; do
    frag=$W/${pair%%=*}; tab=${pair#*=}
    if [ -s "$frag" ]; then
      python3 scripts/apply_tuning.py "$tab" "$frag" | tee -a "$W/summary.txt"
      mkdir -p "$W/applied" && cp "$tab" "$W/applied/$(echo "$tab" | cut -d/ -f2)-tuning.json"
    else
      echo "apply: no $frag" | tee -a "$W/summary.txt"
    fi
  done
fi
if has tests; then
  need_build
  if [ -n "${TESTS_PARALLEL:-}" ]; then
    # one pytest per test path, all at once: the suite is mostly host-bound (references, compiles),
    # so the GPU has room; each part gets the full stage limit and its own log + junit
    [ ${#PATHS[@]} -gt 0 ] || PATHS=(packages/flashattn-triton/tests packages/int8-gemm/tests \
      packages/fused-rmsnorm/tests packages/llmk-meta/tests tests)
    t=$SECONDS; pids=(); names=()
    read -r -a extra <<< "${TEST_ARGS:-}"  # pytest options for every part, e.g. TEST_ARGS="-x --tb=short"
    for a in "${PATHS[@]}"; do
      n=$(echo "$a" | tr '/' '_' | sed 's/_tests$//; s/^packages_//'); names+=("$n")
      timeout "${TESTS_LIMIT:-$LIMIT}" "${PYTEST[@]}" --durations=8 --junitxml="$W/junit_$n.xml" "$a" "${extra[@]}" \
        >"$W/gpu_tests_$n.log" 2>&1 &
      pids+=($!)
    done
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}"; rc=$?; [ $rc -eq 5 ] && rc=0  # 5: no GPU test in that path
      echo "gpu_tests[${names[$i]}]: rc=$rc $((SECONDS - t))s (t=$((SECONDS - T0))s) $(grep -E '[0-9]+ (passed|failed)' "$W/gpu_tests_${names[$i]}.log" | tail -1)" | tee -a "$W/summary.txt"
      [ $rc -eq 0 ] || status=1
    done
    pack
  else
    stage gpu_tests "${TESTS_LIMIT:-$LIMIT}" "${PYTEST[@]}" --junitxml="$W/junit.xml" "${PATHS[@]}"
  fi
fi
if has tune; then
  stage tune_int8 "${TUNE_LIMIT:-$LIMIT}" python3 scripts/tune_int8.py "$W" --budget "${TUNE_BUDGET:-120}"
  [ -s "$W/tuning_int8_gemm.json" ] && cp "$W/tuning_int8_gemm.json" packages/int8-gemm/src/int8_gemm/tuning.json
fi
if has tune_rmsnorm; then
  need_build
  stage tune_rmsnorm "${TUNE_LIMIT:-$LIMIT}" python3 scripts/tune_rmsnorm.py "$W/tune_rmsnorm"
  [ -s "$W/tune_rmsnorm/tuning.json" ] && cp "$W/tune_rmsnorm/tuning.json" packages/fused-rmsnorm/src/fused_rmsnorm/tuning.json
fi
has sass && stage sass "${SASS_LIMIT:-$LIMIT}" python3 scripts/int8_sass.py
if has bench; then
  export LLMK_BENCH_STREAM=$W/bench_stream.jsonl  # records are appended as they finish
  rm -f "$LLMK_BENCH_STREAM"
  # BENCH_SEED: records (JSON lines) of suites not re-run this time, merged with the fresh ones
  [ -n "${BENCH_SEED:-}" ] && cp "$BENCH_SEED" "$LLMK_BENCH_STREAM"
  for s in ${BENCH_SUITES:-attention int8 rmsnorm}; do
    [ $s = rmsnorm ] && need_build
    stage "bench_$s" "${BENCH_LIMIT:-$LIMIT}" python3 benchmarks/run_all.py $s $QUICK --json "$W/bench_$s.json"
  done
  unset LLMK_BENCH_STREAM
  stage merge 120 python3 benchmarks/merge_results.py "$W/bench_stream.jsonl" --out-dir "$W" --plot
  stage roofline 300 sh -c "python3 benchmarks/roofline.py $W/\$(cat $W/merged_name) --out $W"
fi
if has late && [ -n "${LATE_TESTS:-}" ]; then
  need_build
  # shellcheck disable=SC2086
  stage gpu_tests_late "${LATE_LIMIT:-$LIMIT}" "${PYTEST[@]}" $LATE_TESTS
fi
if has wheel; then
  # scratch (wheels, installed sites, JIT cache) stays outside OUTDIR; logs + junit come back
  wait $WHEEL_BUILD; echo "wheel build: rc=$? (t=$((SECONDS - T0))s)" | tee -a "$W/summary.txt"
  stage wheel "${WHEEL_LIMIT:-$LIMIT}" bash scripts/gpu_rmsnorm_wheel.sh /tmp/llmk_wheel test
  mkdir -p "$W/wheel" && cp /tmp/llmk_wheel/*.log /tmp/llmk_wheel/*.xml /tmp/llmk_wheel/summary.txt "$W/wheel/" 2>/dev/null
  pack
fi
need_build
pack
cat "$W/summary.txt"
exit $status
