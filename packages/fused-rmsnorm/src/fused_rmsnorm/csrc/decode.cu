// Small-M (decode) fused RMSNorm + Linear:
//   y[m, n] = rstd[m] * sum_k x[m, k] * g[k] * W[n, k]  (+ bias[n]),  rstd[m] = rsqrt(mean(x[m]^2) + eps)
// The GEMV is memory bound on W, so the kernel is built to read W exactly once per row chunk:
// * a block of 8 warps computes sum(x^2) for its R rows (warp reduction with __shfl_xor_sync, then
//   across warps through shared memory), without a barrier before the W stream starts;
// * each warp then streams whole rows of W (or a 1/ksplit slice of K, the finest split that still
//   covers N in one wave of blocks, no finer than half a pass of loads per slice) with 16-byte loads,
//   multiplies by g and by every x row on the fly and accumulates in fp32;
// * blocks loop over N (grid-stride), so the per-block rstd prologue is amortised over many W rows;
// * rows beyond R (<= 16) are processed by further row chunks (gridDim.y), reading W again.
// x and g are tiny and re-read by every warp: they go through the read-only/L1 path; W is loaded
// with the streaming hint. Plain CUDA, so it builds for every arch down to sm_70.
#include "frms.h"
#include "vec.cuh"

namespace {
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 4;  // independent 16-byte W loads in flight per lane

template <typename T, int R>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ g, const T* __restrict__ w,
                  int64_t ldw, const T* __restrict__ bias, T* __restrict__ y, int64_t ldy, int64_t M, int64_t N,
                  int64_t K, float eps, int ksplit) {
  __shared__ float s_ss[kWarps][R];  // per-warp partial sums of x^2
  __shared__ float s_part[kWarps][R];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = int64_t(blockIdx.y) * R;
  const int rows = int(min(int64_t(R), M - row0));
  x += row0 * ldx;
  y += row0 * ldy;
  const int64_t nchunks = K / frms::kVec;

  // 1) sum of squares of this block's rows, spread over all 256 threads (one L2 round trip).
  //    Not waited for here: rstd is only needed when the first outputs are written, so the first
  //    W loads below go out without a barrier in between.
  {
    float ss[R];
#pragma unroll
    for (int r = 0; r < R; ++r) ss[r] = 0.f;
    for (int64_t c = threadIdx.x; c < nchunks; c += kThreads) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < rows) {
          float f[8];
          frms::unpack8<T>(frms::ld_cached(x + r * ldx + c * frms::kVec), f);
#pragma unroll
          for (int j = 0; j < 8; ++j) ss[r] = fmaf(f[j], f[j], ss[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      ss[r] = frms::warp_sum(ss[r]);
      if (lane == 0) s_ss[warp][r] = ss[r];
    }
  }
  // rstd of row r from the partials (valid after any __syncthreads that follows step 1)
  auto row_rstd = [&](int r) {
    float t = 0.f;
#pragma unroll
    for (int w2 = 0; w2 < kWarps; ++w2) t += s_ss[w2][r];
    return rsqrtf(t / float(K) + eps);
  };
  bool first = true;

  // 2) GEMV over this block's W rows. Warp -> (W row wn within the step, K slice kp).
  const int nb = kWarps / ksplit;
  const int kp = warp / nb, wn = warp % nb;
  const int64_t per = (nchunks + ksplit - 1) / ksplit;
  const int64_t c_begin = kp * per, c_end = min(nchunks, c_begin + per);

  for (int64_t n0 = int64_t(blockIdx.x) * nb; n0 < N; n0 += int64_t(gridDim.x) * nb) {  // block-uniform
    const int64_t n = n0 + wn;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
    if (n < N) {
      const T* wr = w + n * ldw;
      for (int64_t c = c_begin + lane; c < c_end; c += 32 * kUnroll) {
        uint4 wv[kUnroll], gv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t cc = c + u * 32;
          if (cc < c_end) {
            wv[u] = frms::ld_stream(wr + cc * frms::kVec);
            gv[u] = frms::ld_cached(g + cc * frms::kVec);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t cc = c + u * 32;
          if (cc < c_end) {
            float wf[8], gf[8];
            frms::unpack8<T>(wv[u], wf);
            frms::unpack8<T>(gv[u], gf);
#pragma unroll
            for (int j = 0; j < 8; ++j) wf[j] *= gf[j];
#pragma unroll
            for (int r = 0; r < R; ++r) {
              if (r < rows) {
                float xf[8];
                frms::unpack8<T>(frms::ld_cached(x + r * ldx + cc * frms::kVec), xf);
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[r] = fmaf(xf[j], wf[j], acc[r]);
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = frms::warp_sum(acc[r]);

    if (ksplit == 1) {
      if (first) {  // block-uniform: the one barrier that publishes s_ss
        __syncthreads();
        first = false;
      }
      if (lane == 0 && n < N) {
        const float b = bias ? frms::to_float<T>(bias[n]) : 0.f;
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (r < rows) y[r * ldy + n] = frms::from_float<T>(fmaf(acc[r], row_rstd(r), b));
      }
    } else {
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) s_part[warp][r] = acc[r];
      }
      __syncthreads();
      for (int t = threadIdx.x; t < nb * R; t += kThreads) {
        const int tw = t / R, r = t % R;
        const int64_t nn = n0 + tw;
        if (r < rows && nn < N) {
          float s = 0.f;
          for (int p = 0; p < ksplit; ++p) s += s_part[p * nb + tw][r];
          const float b = bias ? frms::to_float<T>(bias[nn]) : 0.f;
          y[r * ldy + nn] = frms::from_float<T>(fmaf(s, row_rstd(r), b));
        }
      }
      __syncthreads();  // s_part is reused by the next step
    }
  }
}

template <typename T, int R>
int launch(const void* x, int64_t ldx, const void* g, const void* w, int64_t ldw, const void* bias, void* y,
           int64_t ldy, int64_t M, int64_t N, int64_t K, float eps, int ksplit, int grid_blocks, cudaStream_t s) {
  // Resident capacity of this instantiation (register-limited: 2-3 blocks of 256 threads per SM).
  static const int occ = [] {
    int n = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_kernel<T, R>, kThreads, 0);
    return n > 0 ? n : 1;
  }();
  const int64_t chunks = (M + R - 1) / R;
  // one wave of resident blocks shared by the row chunks; grid-stride over N inside each block
  const int64_t resident = max(int64_t(1), int64_t(frms::sm_count()) * occ / chunks);
  if (ksplit <= 0) {
    // The largest K split whose blocks (kWarps / ksplit W rows each) fit in one wave, so each block takes its rows
    // in one step. Splitting until the blocks fill the SMs instead overshot into a second wave (H100 s50, M1:
    // D2048 N512 split 8 in two steps 4.82 us, split 4 in one 3.85; D4096 N1024 split 4 7.18, split 2 6.27).
    ksplit = kWarps;
    while (ksplit > 1 && (N + kWarps / ksplit - 1) / (kWarps / ksplit) > resident) ksplit /= 2;
    // Nor finer than half a pass of a lane's loads (32 lanes x kUnroll x 8 = 1024 elements) per warp slice: the
    // split leaves each slice in (512, 1024] at one row, in [512, 1024) from two (their FMAs per element double, so
    // at K 1024 x 2^j half a pass pays). A finer split shortens no lane's chain of loads and adds the cross-warp
    // sum. H100 s53, forced splits, old rule -> this one, mean of runs: M1 D1024 N384 3.43 -> 2.83 us, D2560 N384
    // 3.91 -> 3.68, M4 D1024 N256 3.59 -> 3.10, D3072 N256 4.39 -> 3.99; within 0.09 of the best split at all 46
    // shapes timed. Measured to 4 rows only.
    if (R <= 4) {
      const int64_t pass = 32 * kUnroll * frms::kVec;
      int most = 1;
      while (most < kWarps && (R == 1 ? most * pass < K : most * pass <= K)) most *= 2;
      ksplit = min(ksplit, most);
    }
  }
  if (ksplit != 1 && ksplit != 2 && ksplit != 4 && ksplit != 8) return FRMS_ERR_BAD_ARG;
  const int nb = kWarps / ksplit;
  const int64_t needed = (N + nb - 1) / nb;
  const int64_t cap = grid_blocks > 0 ? int64_t(grid_blocks) : resident;
  // equalise the per-block step count (a block doing one step more than the others is the tail)
  const int64_t steps = (needed + cap - 1) / cap;
  const int64_t grid_x = (needed + steps - 1) / steps;
  const dim3 grid{unsigned(grid_x), unsigned(chunks), 1u}, block{unsigned(kThreads), 1u, 1u};
  decode_kernel<T, R><<<grid, block, 0, s>>>(static_cast<const T*>(x), ldx, static_cast<const T*>(g),
                                             static_cast<const T*>(w), ldw, static_cast<const T*>(bias),
                                             static_cast<T*>(y), ldy, M, N, K, eps, ksplit);
  return 0;
}

template <typename T>
int launch_rows(const void* x, int64_t ldx, const void* g, const void* w, int64_t ldw, const void* bias, void* y,
                 int64_t ldy, int64_t M, int64_t N, int64_t K, float eps, int ksplit, int grid_x, cudaStream_t s) {
  // Rows per chunk: the smallest of 1/2/4/8/16 that covers M (16-row chunks beyond that).
  if (M <= 1)
    return launch<T, 1>(x, ldx, g, w, ldw, bias, y, ldy, M, N, K, eps, ksplit, grid_x, s);
  else if (M <= 2)
    return launch<T, 2>(x, ldx, g, w, ldw, bias, y, ldy, M, N, K, eps, ksplit, grid_x, s);
  else if (M <= 4)
    return launch<T, 4>(x, ldx, g, w, ldw, bias, y, ldy, M, N, K, eps, ksplit, grid_x, s);
  else if (M <= 8)
    return launch<T, 8>(x, ldx, g, w, ldw, bias, y, ldy, M, N, K, eps, ksplit, grid_x, s);
  else  // 16-row chunks: W is streamed ceil(M / 16) times (a 14336x4096 W does not fit in L2)
    return launch<T, 16>(x, ldx, g, w, ldw, bias, y, ldy, M, N, K, eps, ksplit, grid_x, s);
}
}  // namespace

extern "C" int frms_decode(int dtype, const void* x, int64_t ldx, const void* g, const void* w, int64_t ldw,
                           const void* bias, void* y, int64_t ldy, int64_t M, int64_t N, int64_t K, float eps,
                           int ksplit, int grid_blocks, void* stream) {
  if (M <= 0 || N <= 0) return 0;
  if (K <= 0 || K % frms::kVec || ldx % frms::kVec || ldw % frms::kVec) return FRMS_ERR_BAD_ARG;
  if (!frms::aligned16(x) || !frms::aligned16(g) || !frms::aligned16(w)) return FRMS_ERR_BAD_ARG;
  if ((M + 15) / 16 > 65535) return FRMS_ERR_BAD_ARG;  // gridDim.y limit; the small-M path never gets near it
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  int st = FRMS_ERR_BAD_ARG;
  if (dtype == FRMS_DTYPE_F16)
    st = launch_rows<__half>(x, ldx, g, w, ldw, bias, y, ldy, M, N, K, eps, ksplit, grid_blocks, s);
  else if (dtype == FRMS_DTYPE_BF16)
    st = launch_rows<__nv_bfloat16>(x, ldx, g, w, ldw, bias, y, ldy, M, N, K, eps, ksplit, grid_blocks, s);
  return st != 0 ? st : int(cudaGetLastError());
}
