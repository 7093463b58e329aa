#!/usr/bin/env bash
# One device call for the maintainers' GPU lease: runs a list of stages, then packs everything
# under $OUT into few files (the lease returns at most 8 files).
#   scripts/device_session.sh STAGE[,STAGE...]   stages: tests tune bench quickbench exp roofline profile wheel
set -uo pipefail
OUT=${OUT:?OUT must be set}
STAGES=${1:-tests}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
W=/tmp/llmk_out
rm -rf $W && mkdir -p $W
args=()
case ",$STAGES," in *,tests,*) ;; *) args+=(--no-tests) ;; esac
case ",$STAGES," in *,tune,*) args+=(--tune) ;; esac
case ",$STAGES," in *,bench,*) ;; *,quickbench,*) args+=(--quick) ;; *) args+=(--no-bench) ;; esac
timeout ${GPU_RUN_TIMEOUT:-480} scripts/gpu_run.sh $W "${args[@]}"
export PYTHONPATH=/tmp/llmk_site:$ROOT/packages/flashattn-triton/src:$ROOT/packages/int8-gemm/src:$ROOT/packages/fused-rmsnorm/src:$ROOT/packages/llmk-meta/src
case ",$STAGES," in *,exp,*) timeout 300 python3 experiments/attention_ablation.py --out $W/exp > $W/exp.log 2>&1; echo "exp rc=$?"; tail -30 $W/exp.log ;; esac
case ",$STAGES," in *,roofline,*) [ -f $W/bench.json ] && timeout 120 python3 benchmarks/roofline.py $W/bench.json --out $W > $W/roofline.log 2>&1; tail -40 $W/roofline.log ;; esac
case ",$STAGES," in *,profile,*) timeout 240 python3 benchmarks/profile_kernels.py --out $W > $W/profile.log 2>&1; tail -40 $W/profile.log ;; esac
case ",$STAGES," in *,wheel,*) [ -x scripts/gpu_rmsnorm_wheel.sh ] && timeout 300 scripts/gpu_rmsnorm_wheel.sh $W/wheel > $W/wheel.log 2>&1; echo "wheel rc=$?"; tail -20 $W/wheel.log ;; esac
tar czf $OUT/results.tgz -C $W .
cp $W/summary.txt $OUT/ 2>/dev/null
ls -la $W
