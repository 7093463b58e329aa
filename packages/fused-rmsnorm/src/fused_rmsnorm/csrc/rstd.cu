// rstd[m] = 1 / sqrt(mean_k x[m, k]^2 + eps), fp32, one to eight warps per row.
// Feeds the prefill GEMM's epilogue. On Hopper it triggers programmatic dependent launch at once so
// the GEMM (launched with the PDL attribute) runs its whole mainloop while this kernel runs; the
// GEMM waits for it (griddepcontrol.wait) only in the epilogue, right before reading rstd.
#include "frms.h"
#include "vec.cuh"

#include <type_traits>

namespace {
// A row is summed by a group of kWpr warps (1, 2, 4 or 8: the fewest for which each lane has at most
// kLoads 16-byte chunks of the row), and every lane issues all of its loads before the first FMA. The
// GEMM this kernel feeds cannot share an SM with it (a GEMM CTA takes the whole register file), so every
// SM an rstd CTA sits on starts its GEMM tile late by this kernel's latency: one round trip per lane
// instead of one per 4 chunks (session 10: a warp per row needed 8 dependent round trips at D = 8192).
constexpr int kLoads = 8;

inline int warps_per_row(int64_t K) {
  const int64_t chunks = K / frms::kVec;
  for (int w = 1; w < 8; w *= 2)
    if (chunks <= int64_t(w) * 32 * kLoads) return w;
  return 8;  // longer rows: more than one batch of kLoads per lane
}

// Grid-stride over groups of kWarps / kWpr rows per CTA (the trip count is uniform across the CTA, so
// the partial sums can meet in shared memory behind __syncthreads). Per row the lane / warp order is
// fixed by (K, kWpr) alone: every launch shape (wide or side) gives the same bits.
//
// kScale (rstd_scale_kernel): also writes xg = x * g, rounded once to T like torch's x * g, from the same loads.
template <typename T, int kWpr, int kWarps, bool kScale = false>
__device__ __forceinline__ void rstd_rows(const T* __restrict__ x, int64_t ldx, float* __restrict__ rstd, int64_t M,
                                          int64_t K, float eps, const T* __restrict__ g = nullptr,
                                          T* __restrict__ xg = nullptr, int64_t ldxg = 0) {
  constexpr int kRows = kWarps / kWpr;
  __shared__ float part[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = warp / kWpr, w = warp % kWpr;
  const int64_t chunks = K / frms::kVec;
  constexpr int kStride = kWpr * 32;  // chunks between one lane's consecutive loads
  for (int64_t base = int64_t(blockIdx.x) * kRows; base < M; base += int64_t(gridDim.x) * kRows) {
    const int64_t row = base + grp;
    float ss = 0.f;
    if (row < M) {
      const T* xr = x + row * ldx;
      for (int64_t c0 = w * 32 + lane; c0 < chunks; c0 += int64_t(kStride) * kLoads) {
        uint4 v[kLoads], gv[kScale ? kLoads : 1];
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
          const int64_t c = c0 + int64_t(i) * kStride;
          v[i] = c < chunks ? frms::ld_stream(xr + c * frms::kVec) : make_uint4(0, 0, 0, 0);
          if constexpr (kScale) gv[i] = c < chunks ? frms::ld_cached(g + c * frms::kVec) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < kLoads; ++i) {
          float f[8];
          frms::unpack8<T>(v[i], f);
#pragma unroll
          for (int j = 0; j < 8; ++j) ss = fmaf(f[j], f[j], ss);
          if constexpr (kScale) {
            const int64_t c = c0 + int64_t(i) * kStride;
            if (c < chunks) {
              float gf[8];
              frms::unpack8<T>(gv[i], gf);
              uint4 o;
              T* op = reinterpret_cast<T*>(&o);
#pragma unroll
              for (int j = 0; j < 8; ++j) op[j] = frms::from_float<T>(f[j] * gf[j]);  // exact product, one rounding
              *reinterpret_cast<uint4*>(xg + row * ldxg + c * frms::kVec) = o;
            }
          }
        }
      }
    }
    ss = frms::warp_sum(ss);
    if constexpr (kWpr > 1) {
      if (lane == 0) part[warp] = ss;
      __syncthreads();
      ss = 0.f;
#pragma unroll
      for (int i = 0; i < kWpr; ++i) ss += part[grp * kWpr + i];  // fixed order: deterministic
      __syncthreads();  // before the next iteration overwrites part[]
    }
    if (row < M && w == 0 && lane == 0) rstd[row] = rsqrtf(ss / float(K) + eps);
  }
}

constexpr int kWideWarps = 8;   // default launch: 8 warps per CTA, one CTA per 8 / kWpr rows
constexpr int kSideWarps = 32;  // side launch: a few 32-warp CTAs (see frms_rstd)

// minBlocks: lets ptxas keep all kLoads loads of a lane in flight (with the default it stopped at 32
// registers and interleaved the loads with the FMAs: two round trips)
template <typename T, int kWpr>
__global__ void __launch_bounds__(kWideWarps * 32, 2)
    rstd_kernel(const T* __restrict__ x, int64_t ldx, float* __restrict__ rstd, int64_t M, int64_t K, float eps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  rstd_rows<T, kWpr, kWideWarps>(x, ldx, rstd, M, K, eps);
}

// The same sums from a few 32-warp CTAs, for the Hopper PDL launch when the GEMM's persistent grid leaves
// SMs idle. A GEMM CTA (384 threads x 168 registers) cannot share an SM with an rstd CTA, so with
// rstd_kernel's grid (one CTA on nearly every SM) the GEMM began on most SMs only as those CTAs retired.
// With ctas = SMs - GEMM CTAs the rstd kernel runs on SMs the GEMM never uses, the GEMM starts everywhere
// at once, and rstd only has to be done by its epilogue.
//
// streamed: the GEMM does not wait for this grid at all (its grid is capped to leave these SMs free, and
// each epilogue spins until its rows' rstd is no longer FRMS_RSTD_POISON, see gemm_sm90.cu RstdScale). So
// every CTA first marks its own rows as poison, makes that visible, and only then lets the GEMM launch;
// each row's value is then its own ready flag (rstd is never negative), written once, in row order.
template <typename T, int kWpr>
__global__ void __launch_bounds__(kSideWarps * 32, 1)
    rstd_side_kernel(const T* __restrict__ x, int64_t ldx, float* __restrict__ rstd, int64_t M, int64_t K,
                     float eps, int streamed) {
  if (streamed) {
    constexpr int kRows = kSideWarps / kWpr;  // rstd_rows' row mapping: the rows this CTA will write
    for (int64_t base = int64_t(blockIdx.x) * kRows; base < M; base += int64_t(gridDim.x) * kRows)
      if (threadIdx.x < kRows && base + threadIdx.x < M) rstd[base + threadIdx.x] = __uint_as_float(FRMS_RSTD_POISON);
    __threadfence();  // poison visible GPU-wide before any GEMM CTA can start (it launches after the trigger)
    __syncthreads();
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  rstd_rows<T, kWpr, kSideWarps>(x, ldx, rstd, M, K, eps);
}

// A functional call (no cached W' = W * g) on the GEMM path: rstd and the GEMM's operand xg = x * g in one pass
// over x, instead of a torch multiply and then rstd_kernel reading x again. No PDL trigger: the GEMM's mainloop
// reads xg, so it is launched without PDL after this grid.
template <typename T, int kWpr>
__global__ void __launch_bounds__(kWideWarps * 32, 2)
    rstd_scale_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ g, T* __restrict__ xg,
                      int64_t ldxg, float* __restrict__ rstd, int64_t M, int64_t K, float eps) {
  rstd_rows<T, kWpr, kWideWarps, true>(x, ldx, rstd, M, K, eps, g, xg, ldxg);
}

// The GEMM that follows (on Hopper its programmatic dependent) needs ~200 KB of shared memory per SM. Under the
// default carveout preference the driver may run this kernel with a small shared-memory split, and an SM it used
// must then be reconfigured before a GEMM CTA can start there, so ask for the GEMM's split (once per kernel and
// device). H200, module path, same-process A/B: 0.1-0.9 us less per call at five prefill shapes, outputs
// bit-identical (benchmarks/results/probes/h200-probe_rmsnorm_carveout.json; the mechanism is not profiled).
template <auto kKernel>  // one flag per kernel and device
void prefer_shared() {
  static signed char done[frms::kMaxDevices];
  const int dev = frms::current_device();
  if (done[dev]) return;
  done[dev] = 1;
  if (cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) !=
      cudaSuccess)
    cudaGetLastError();  // only a preference: launch under the driver's choice
}

template <typename T, int kWpr>
void launch(const void* x, int64_t ldx, float* rstd, int64_t M, int64_t K, float eps, int ctas, int streamed,
            cudaStream_t s) {
  const T* xp = static_cast<const T*>(x);
  if (ctas > 0) {
    constexpr int rows = kSideWarps / kWpr;
    const int64_t need = (M + rows - 1) / rows;
    prefer_shared<rstd_side_kernel<T, kWpr>>();
    if (streamed > 1) {
      // Launched as clusters of the GEMM's cluster size: a lone rstd CTA in a GPC would leave an odd number
      // of SMs there, and a 2-CTA GEMM cluster could not use the last one (capped grid: every cluster must fit).
      // The grid is the full ctas (a multiple of the cluster size) even if some CTAs get no rows.
      frms::launch_clustered(rstd_side_kernel<T, kWpr>, dim3(unsigned(ctas)), dim3(kSideWarps * 32), 0, s,
                             dim3(unsigned(streamed)), xp, ldx, rstd, M, K, eps, 1);
      return;
    }
    dim3 grid(unsigned(need < ctas ? need : ctas)), block(kSideWarps * 32);
    rstd_side_kernel<T, kWpr><<<grid, block, 0, s>>>(xp, ldx, rstd, M, K, eps, streamed);
  } else {
    constexpr int rows = kWideWarps / kWpr;
    dim3 grid(unsigned((M + rows - 1) / rows)), block(kWideWarps * 32);
    prefer_shared<rstd_kernel<T, kWpr>>();
    rstd_kernel<T, kWpr><<<grid, block, 0, s>>>(xp, ldx, rstd, M, K, eps);
  }
}

// f(std::integral_constant<int, warps_per_row(K)>{}): the compile-time row-group size of every launcher here
template <typename F>
void with_wpr(int64_t K, F&& f) {
  switch (warps_per_row(K)) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

template <typename T>
void launch_any(const void* x, int64_t ldx, float* rstd, int64_t M, int64_t K, float eps, int ctas, int streamed,
                cudaStream_t s) {
  with_wpr(K, [&](auto w) { launch<T, decltype(w)::value>(x, ldx, rstd, M, K, eps, ctas, streamed, s); });
}
}  // namespace

// ctas == 0: 8-warp CTAs, each for 8 / warps_per_row(K) rows; ctas > 0: at most that many 32-warp CTAs
// (rstd_side_kernel; the caller passes the SMs the PDL-launched GEMM leaves idle). Same bits either way.
// streamed > 0 (needs ctas > 0, a multiple of it): the poison-then-fill protocol of rstd_side_kernel for a
// GEMM launched with streamed_rstd, as clusters of `streamed` CTAs.
extern "C" int frms_rstd(int dtype, const void* x, int64_t ldx, float* rstd, int64_t M, int64_t K, float eps,
                         int ctas, int streamed, void* stream) {
  if (M <= 0) return 0;
  if (K <= 0 || K % frms::kVec || ldx % frms::kVec || !frms::aligned16(x) || ctas < 0) return FRMS_ERR_BAD_ARG;
  if (streamed < 0 || streamed > 2 || (streamed && (ctas == 0 || ctas % streamed))) return FRMS_ERR_BAD_ARG;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == FRMS_DTYPE_F16)
    launch_any<__half>(x, ldx, rstd, M, K, eps, ctas, streamed, s);
  else if (dtype == FRMS_DTYPE_BF16)
    launch_any<__nv_bfloat16>(x, ldx, rstd, M, K, eps, ctas, streamed, s);
  else
    return FRMS_ERR_BAD_ARG;
  return int(cudaGetLastError());
}

namespace {
template <typename T, int kWpr>
void launch_scale(const void* x, int64_t ldx, const void* g, void* xg, int64_t ldxg, float* rstd, int64_t M,
                  int64_t K, float eps, cudaStream_t s) {
  constexpr int rows = kWideWarps / kWpr;
  dim3 grid(unsigned((M + rows - 1) / rows)), block(kWideWarps * 32);
  rstd_scale_kernel<T, kWpr><<<grid, block, 0, s>>>(static_cast<const T*>(x), ldx, static_cast<const T*>(g),
                                                     static_cast<T*>(xg), ldxg, rstd, M, K, eps);
}

template <typename T>
void launch_scale_any(const void* x, int64_t ldx, const void* g, void* xg, int64_t ldxg, float* rstd, int64_t M,
                      int64_t K, float eps, cudaStream_t s) {
  with_wpr(K, [&](auto w) { launch_scale<T, decltype(w)::value>(x, ldx, g, xg, ldxg, rstd, M, K, eps, s); });
}
}  // namespace

// rstd as frms_rstd (same bits) and xg[m, k] = x[m, k] * g[k] rounded once to the dtype; no PDL trigger.
extern "C" int frms_rstd_scale(int dtype, const void* x, int64_t ldx, const void* g, void* xg, int64_t ldxg,
                               float* rstd, int64_t M, int64_t K, float eps, void* stream) {
  if (M <= 0) return 0;
  if (K <= 0 || K % frms::kVec || ldx % frms::kVec || ldxg % frms::kVec || !frms::aligned16(x) ||
      !frms::aligned16(g) || !frms::aligned16(xg))
    return FRMS_ERR_BAD_ARG;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == FRMS_DTYPE_F16)
    launch_scale_any<__half>(x, ldx, g, xg, ldxg, rstd, M, K, eps, s);
  else if (dtype == FRMS_DTYPE_BF16)
    launch_scale_any<__nv_bfloat16>(x, ldx, g, xg, ldxg, rstd, M, K, eps, s);
  else
    return FRMS_ERR_BAD_ARG;
  return int(cudaGetLastError());
}
