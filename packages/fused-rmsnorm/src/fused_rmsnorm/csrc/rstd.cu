// rstd[m] = 1 / sqrt(mean_k x[m, k]^2 + eps), fp32, one warp per row.
// Feeds the prefill GEMM's epilogue. On Hopper it triggers programmatic dependent launch at once so
// the GEMM (launched with the PDL attribute) runs its whole mainloop while this kernel runs; the
// GEMM waits for it (griddepcontrol.wait) only in the epilogue, right before reading rstd.
#include "frms.h"
#include "vec.cuh"

namespace {
constexpr int kRowsPerBlock = 8;

// One warp: rstd of the row at xr (lane order fixed, so every launch shape gives the same bits).
template <typename T>
__device__ __forceinline__ float row_rstd(const T* __restrict__ xr, int64_t K, float eps, int lane) {
  const int64_t chunks = K / frms::kVec;
  float ss = 0.f;
#pragma unroll 4
  for (int64_t c = lane; c < chunks; c += 32) {
    float f[8];
    frms::unpack8<T>(frms::ld_stream(xr + c * frms::kVec), f);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss = fmaf(f[j], f[j], ss);
  }
  return rsqrtf(frms::warp_sum(ss) / float(K) + eps);
}

template <typename T>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    rstd_kernel(const T* __restrict__ x, int64_t ldx, float* __restrict__ rstd, int64_t M, int64_t K, float eps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= M) return;
  const float r = row_rstd(x + row * ldx, K, eps, lane);
  if (lane == 0) rstd[row] = r;
}

// The same sums from a few 32-warp CTAs (grid-striding over the rows), for the Hopper PDL launch when
// the GEMM's persistent grid leaves SMs idle. A GEMM CTA (384 threads x 168 registers) cannot share an
// SM with an rstd CTA, so with rstd_kernel's grid (M / 8 CTAs, one on nearly every SM) the GEMM began
// on most SMs only as those CTAs retired. With ctas = SMs - GEMM CTAs the rstd kernel runs on SMs the
// GEMM never uses, the GEMM starts everywhere at once, and rstd only has to be done by its epilogue.
constexpr int kSideWarps = 32;

template <typename T>
__global__ void __launch_bounds__(kSideWarps * 32)
    rstd_side_kernel(const T* __restrict__ x, int64_t ldx, float* __restrict__ rstd, int64_t M, int64_t K,
                     float eps) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int lane = threadIdx.x & 31;
  const int64_t stride = int64_t(gridDim.x) * kSideWarps;
  for (int64_t row = int64_t(blockIdx.x) * kSideWarps + (threadIdx.x >> 5); row < M; row += stride) {
    const float r = row_rstd(x + row * ldx, K, eps, lane);
    if (lane == 0) rstd[row] = r;
  }
}
}  // namespace

// ctas == 0: one warp per row, 8 rows per CTA; ctas > 0: that many 32-warp CTAs (rstd_side_kernel;
// the caller passes the SMs the PDL-launched GEMM leaves idle).
extern "C" int frms_rstd(int dtype, const void* x, int64_t ldx, float* rstd, int64_t M, int64_t K, float eps,
                         int ctas, void* stream) {
  if (M <= 0) return 0;
  if (K <= 0 || K % frms::kVec || ldx % frms::kVec || !frms::aligned16(x) || ctas < 0) return FRMS_ERR_BAD_ARG;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (ctas > 0) {
    const int64_t need = (M + kSideWarps - 1) / kSideWarps;
    dim3 grid(unsigned(need < ctas ? need : ctas)), block(kSideWarps * 32);
    if (dtype == FRMS_DTYPE_F16)
      rstd_side_kernel<__half><<<grid, block, 0, s>>>(static_cast<const __half*>(x), ldx, rstd, M, K, eps);
    else if (dtype == FRMS_DTYPE_BF16)
      rstd_side_kernel<__nv_bfloat16>
          <<<grid, block, 0, s>>>(static_cast<const __nv_bfloat16*>(x), ldx, rstd, M, K, eps);
    else
      return FRMS_ERR_BAD_ARG;
    return int(cudaGetLastError());
  }
  dim3 grid(unsigned((M + kRowsPerBlock - 1) / kRowsPerBlock)), block(kRowsPerBlock * 32);
  if (dtype == FRMS_DTYPE_F16)
    rstd_kernel<__half><<<grid, block, 0, s>>>(static_cast<const __half*>(x), ldx, rstd, M, K, eps);
  else if (dtype == FRMS_DTYPE_BF16)
    rstd_kernel<__nv_bfloat16><<<grid, block, 0, s>>>(static_cast<const __nv_bfloat16*>(x), ldx, rstd, M, K, eps);
  else
    return FRMS_ERR_BAD_ARG;
  return int(cudaGetLastError());
}
