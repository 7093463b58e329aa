#!/usr/bin/env bash
# Nsight Compute over scripts/ncu_decode.py: one profiled call per decode kernel, ours and cuBLAS's.
#   scripts/ncu_decode.sh OUTDIR [--cases rms,int8]
# Needs the packages' src dirs importable (scripts/gpu_run.sh sets PYTHONPATH) and, for the rms cases,
# the fused_rmsnorm extension built. Clocks are left alone (--clock-control none) and caches flushed
# between kernels (ncu's default), so W comes from HBM as in a real decode step.
set -euo pipefail
W=${1:?usage: scripts/ncu_decode.sh OUTDIR [--cases LIST]}; shift
mkdir -p "$W"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,lts__t_bytes.sum,launch__grid_size,launch__block_size,launch__registers_per_thread
M=$M,launch__shared_mem_per_block_dynamic,launch__shared_mem_per_block_static
M=$M,sm__warps_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed
ncu --nvtx --nvtx-include "prof/" --clock-control none --csv --page raw --metrics "$M" \
  --log-file "$W/ncu_decode.csv" python3 "$(dirname "$0")/ncu_decode.py" "$@" | tee "$W/ncu_decode.cases"
python3 "$(dirname "$0")/ncu_decode_report.py" "$W"
