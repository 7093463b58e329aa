#!/usr/bin/env bash
# Nsight Compute sections (speed of light, compute / memory workload, warp states, scheduler, occupancy) for
# the fused-rmsnorm modules' kernels next to the cuBLAS kernel F.linear runs, at the two shapes whose bars
# are missed (M16 D4096 N14336 decode, M1024 D2048 N2048 prefill): scripts/ncu_decode.py --cases rmsmod.
#   scripts/ncu_rmsnorm_module.sh OUTDIR [CASES]   (CASES: rmsmod (default) | rmsbig, M4096 4096^2 prefill)
# Needs the packages' src dirs importable and the fused_rmsnorm extension built. Clocks are left alone
# (--clock-control none); caches are flushed between kernels (ncu's default), so W comes from HBM.
set -euo pipefail
W=${1:?usage: scripts/ncu_rmsnorm_module.sh OUTDIR [CASES]}
C=${2:-rmsmod}
mkdir -p "$W"
S=""
for s in SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis WarpStateStats SchedulerStats Occupancy LaunchStats; do
  S="$S --section $s"
done
ncu --nvtx --nvtx-include "prof/" --clock-control none $S --log-file "$W/ncu_$C.txt" \
  python3 "$(dirname "$0")/ncu_decode.py" --cases "$C" | tee "$W/ncu_$C.cases"
grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Achieved Occupancy|Registers Per|Tensor|Warp Cycles Per Issued" \
  "$W/ncu_$C.txt" | sed -E 's/ +/ /g' | cut -c1-150
