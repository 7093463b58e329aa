// Hopper GEMM with the RMSNorm row scale in the epilogue:
//   D[m, n] = rstd[m] * sum_k A[m, k] * W'[n, k]  (+ bias[n])
// A = x (row-major, K contiguous), W' = w_lin * g (row-major (N, K) == column-major B), D row-major.
// CUTLASS 3.x TMA warp-specialized mainloop + an EVT epilogue (accumulator x column-broadcast fp32
// vector, plus an optional row-broadcast bias that defaults to 0 when its pointer is null).
// Configs 7-10 compute the same D with the operands swapped (D^T = W' x^T: W rows are the wgmma M, tokens
// its N), for decode batches where 64-row token tiles would be mostly padding.
// This file is compiled once per tile config (FRMS_SM90_CFG = 0..10, see below) and only for sm_90a.
// Runtime knobs of every config (FrmsSm90Args): the tile scheduler's raster order and max swizzle, and
// for the stream-K config a split-K count; a workspace is taken only where CUTLASS needs one.
#include "frms.h"

#include <cuda_runtime.h>

#include <type_traits>

#include "cutlass/version.h"
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/bfloat16.h"
#include "cutlass/half.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#ifndef FRMS_SM90_CFG
#define FRMS_SM90_CFG 0
#endif

namespace {
using namespace cute;

// Tile configs. 0..2 are the shipped ones (tuning tables refer to them by number: never renumber);
// 3..6 were added for shapes with too few tiles or with W reuse across M tiles. A config is a
// BM x BN x 64 tile, a CM x 1 cluster along M (CM = 2: the two M tiles of one N column share each
// W tile through TMA multicast), the cooperative (both consumer warpgroups on one tile) or
// ping-pong (one tile per consumer warpgroup) schedule, and the tile scheduler.
template <int BM, int BN, int CM, bool Coop, class Sched = cutlass::gemm::PersistentScheduler, bool Swap = false,
          int BK = 64>
struct Sm90Cfg {
  static constexpr bool kSwap = Swap;  // BM x BN tile of D^T = W' x^T (BM weight rows x BN tokens)
  using TileShape = Shape<Int<BM>, Int<BN>, Int<BK>>;
  using ClusterShape = Shape<Int<CM>, _1, _1>;
  using KernelSchedule = std::conditional_t<Coop, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                            cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpiSchedule = std::conditional_t<Coop, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                         cutlass::epilogue::TmaWarpSpecialized>;
  using TileSched = Sched;
};
#if FRMS_SM90_CFG == 0
using Cfg = Sm90Cfg<128, 256, 2, true>;  // large M*N
#elif FRMS_SM90_CFG == 1
using Cfg = Sm90Cfg<128, 128, 1, false>;  // mid-size
#elif FRMS_SM90_CFG == 2
using Cfg = Sm90Cfg<64, 128, 1, false>;  // small M: less wasted MMA work on a 16..256-row problem
#elif FRMS_SM90_CFG == 3
using Cfg = Sm90Cfg<64, 128, 2, false>;  // small M, W-bound (M=128 D8192 N8192): W crosses L2 -> SM once
#elif FRMS_SM90_CFG == 4
using Cfg = Sm90Cfg<128, 128, 2, true>;  // mid-size
#elif FRMS_SM90_CFG == 5
using Cfg = Sm90Cfg<256, 128, 2, true>;  // large M: each consumer warpgroup a 128x128 half
#elif FRMS_SM90_CFG == 6
// too few tiles for the SMs (M=128 N8192: 64 tiles; M=16 N14336: 112): stream-K splits the K loop of
// the leftover tiles across CTAs (cooperative only: ping-pong does not support it). Needs a
// workspace (partials + turnstile flags, zeroed by CUTLASS on each launch).
using Cfg = Sm90Cfg<128, 128, 1, true, cutlass::gemm::StreamKScheduler>;
#elif FRMS_SM90_CFG == 7
// decode, <= 16 tokens: swap-AB 64 W rows x 16 tokens x 128 k, ping-pong, 2-CTA clusters along the W rows
// (both CTAs' x tile arrives by one TMA multicast); 20 KB per stage, 11 stages of W in flight per SM.
// cuBLAS runs a 64x16 tile with 2-CTA clusters at M=16 N14336 (README, session 8 profile).
using Cfg = Sm90Cfg<64, 16, 2, false, cutlass::gemm::PersistentScheduler, true, 128>;
#elif FRMS_SM90_CFG == 8
// decode, 17..32 tokens: as 7 with 32-token tiles (24 KB per stage)
using Cfg = Sm90Cfg<64, 32, 2, false, cutlass::gemm::PersistentScheduler, true, 128>;
#elif FRMS_SM90_CFG == 9
// as 7 with 64-wide k-blocks (22 stages of 10 KB)
using Cfg = Sm90Cfg<64, 16, 2, false, cutlass::gemm::PersistentScheduler, true>;
#elif FRMS_SM90_CFG == 10
// as 8 with 64-wide k-blocks
using Cfg = Sm90Cfg<64, 32, 2, false, cutlass::gemm::PersistentScheduler, true>;
#else
#error "unknown FRMS_SM90_CFG"
#endif
using TileShape = Cfg::TileShape;
using ClusterShape = Cfg::ClusterShape;
using KernelSchedule = Cfg::KernelSchedule;
using EpiSchedule = Cfg::EpiSchedule;
using TileSched = Cfg::TileSched;
constexpr bool kSwap = Cfg::kSwap;
#define FRMS_CAT2(a, b) a##b
#define FRMS_CAT(a, b) FRMS_CAT2(a, b)
#define FRMS_ENTRY FRMS_CAT(frms_gemm_sm90_cfg, FRMS_SM90_CFG)
constexpr bool kStreamK = cute::is_same_v<TileSched, cutlass::gemm::StreamKScheduler>;
static_assert(kStreamK == (FRMS_SM90_CFG == FRMS_SM90_STREAM_K_CONFIG), "frms.h names the stream-K config");

// The rstd vector comes from the kernel launched just before this GEMM, which triggers programmatic
// dependent launch at its start. CUTLASS's own grid-dependency wait sits before the mainloop (it
// is compiled out here: CUTLASS_ENABLE_GDC_FOR_SM90 is not defined), so instead the wait is done
// by the rstd broadcast node (column broadcast; row broadcast when swapped) right before it loads
// rstd in the epilogue: the TMA/wgmma mainloop overlaps the rstd kernel. x and W' were written by
// kernels that completed before rstd started. Both broadcast nodes read gmem only in their consumer
// callbacks (no producer loads), which is what makes this placement sufficient.
template <class Base>
struct AfterGridDependency : Base {
  using Base::Base;

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");  // no-op when not launched as a PDL secondary
#endif
    return Base::template get_consumer_store_callbacks<ReferenceSrc>(args);
  }
};

template <typename T>
struct GemmDef {
  // Unswapped: A = x (M, K) row-major, B = W' (N, K) == column-major (K, N), D (M, N) row-major.
  // Swapped: A = W', B = x, D^T (N, M) column-major == the same row-major D.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlign = 8;  // 16 bytes of 16-bit elements
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

  // per-token fp32 vector broadcast along the output features: the rstd scale
  using ColVec = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, int64_t>>;
  using RowVec = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>;
  using RowScale = AfterGridDependency<std::conditional_t<kSwap, RowVec, ColVec>>;
  // per-feature vector broadcast along the tokens: the bias; null pointer -> 0
  using BiasCol = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, T, float, Stride<_1, _0, int64_t>>;
  using BiasRow = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, T, float, Stride<_0, _1, int64_t>>;
  using Bias = std::conditional_t<kSwap, BiasCol, BiasRow>;
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>,
      cutlass::epilogue::fusion::Sm90AccFetch, RowScale>;
  using Fusion = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, T, float, kRound>, Scaled, Bias>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlign, T, LayoutD, kAlign,
      EpiSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, LayoutA, kAlign, T, LayoutB, kAlign, float, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, TileSched>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

int sm_count_cached() {
  // Querying per call costs a driver round trip; the device of the first call is assumed (one
  // GPU per process is the common case, and the value only sizes the persistent grid).
  static int count = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n;
  }();
  return count;
}

template <typename T>
int run(const FrmsSm90Args& p, size_t* workspace_size_out) {
  using Def = GemmDef<T>;
  using Gemm = typename Def::Gemm;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  const int64_t M = p.M, N = p.N, K = p.K;

  // scheduler knobs: raster 0 heuristic / 1 along M / 2 along N; swizzle 0 (= 1) | 1 | 2 | 4 | 8;
  // splits > 1 (a fixed split-K decomposition) only for the stream-K config
  if (p.raster < 0 || p.raster > 2) return FRMS_ERR_BAD_ARG;
  const int swizzle = p.swizzle == 0 ? 1 : p.swizzle;
  if (swizzle != 1 && swizzle != 2 && swizzle != 4 && swizzle != 8) return FRMS_ERR_BAD_ARG;
  if (p.splits < 1 || (p.splits > 1 && !kStreamK) || p.splits > 64) return FRMS_ERR_BAD_ARG;

  // (row stride, unit K / N stride, batch stride); rows need not be packed. Batch stride is a
  // nonzero multiple of 16 bytes for the TMA descriptor even though L == 1.
  // Swapped: the GEMM's A is W' (N rows), its B is x (M rows), and D^T (N, M) is column-major.
  const T* pa = static_cast<const T*>(kSwap ? p.b : p.a);
  const T* pb = static_cast<const T*>(kSwap ? p.a : p.b);
  const int64_t lda = kSwap ? p.ldb : p.lda, ldb = kSwap ? p.lda : p.ldb;
  const int64_t GM = kSwap ? N : M, GN = kSwap ? M : N;
  StrideA sa{lda, _1{}, lda * GM};
  StrideB sb{ldb, _1{}, ldb * GN};
  StrideD sd;
  if constexpr (kSwap) {
    sd = StrideD{_1{}, p.ldd, p.ldd * M};
  } else {
    sd = StrideD{p.ldd, _1{}, p.ldd * M};
  }
  const StrideC sc = sd;  // C is void: its stride only has to be well-formed

  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {int(GM), int(GN), int(K), 1},
      {pa, sa, pb, sb},
      {{}, nullptr, sc, static_cast<T*>(p.d), sd}};
  // EVT argument tree: {Scaled{Acc{}, RowScale{ptr, default, stride}, mul{}}, Bias{ptr, default, stride}, plus{}}
  using RowScaleStride = typename Def::RowScale::StrideMNL;
  using BiasStride = typename Def::Bias::StrideMNL;
  args.epilogue.thread = {
      {{}, {p.rstd, 0.f, RowScaleStride{}}, {}},
      {static_cast<const T*>(p.bias), T(0), BiasStride{}},
      {}};
  args.hw_info.sm_count = sm_count_cached();
  if (args.hw_info.sm_count <= 0) return int(cudaErrorNoDevice);  // the schedulers divide by it
  using Raster = decltype(args.scheduler.raster_order);
  args.scheduler.raster_order = p.raster == 1 ? Raster::AlongM : (p.raster == 2 ? Raster::AlongN : Raster::Heuristic);
  args.scheduler.max_swizzle_size = swizzle;
  if constexpr (kStreamK) {
    if (p.splits > 1) {
      args.scheduler.splits = p.splits;
      args.scheduler.decomposition_mode = decltype(args.scheduler.decomposition_mode)::SplitK;
    }
  }

  // The workspace depends on the shape, the knobs and the SM count only (no pointers are read).
  const size_t need = Gemm::get_workspace_size(args);
  if (workspace_size_out) {
    *workspace_size_out = need;
    return 0;
  }
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return FRMS_ERR_BAD_ARG;
  // The data-parallel configs need none; stream-K takes the caller's (torch-allocated) buffer rather
  // than allocating per call. CUTLASS zeroes the part it needs in initialize(), on the stream.
  if (need > p.workspace_bytes || (need && !p.workspace)) return FRMS_ERR_WORKSPACE;
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  if (gemm.initialize(args, need ? p.workspace : nullptr, stream) != cutlass::Status::kSuccess)
    return FRMS_ERR_CUTLASS;
  // Stream-K: initialize() put a memset of the turnstile flags between the rstd kernel and this one, so
  // PDL could overlap nothing, and CUTLASS's own grid-dependency waits (before the flags are read) are
  // compiled out here: launch it as an ordinary stream-ordered kernel.
  cutlass::Status st = gemm.run(stream, nullptr, p.pdl != 0 && need == 0);
  if (st != cutlass::Status::kSuccess) {
    cudaError_t e = cudaGetLastError();
    return e != cudaSuccess ? int(e) : FRMS_ERR_CUTLASS;
  }
  return int(cudaGetLastError());
}
}  // namespace

extern "C" int FRMS_ENTRY(const FrmsSm90Args* p, size_t* workspace_size_out) {
  if (p == nullptr) return FRMS_ERR_BAD_ARG;
  if (p->dtype == FRMS_DTYPE_BF16) return run<cutlass::bfloat16_t>(*p, workspace_size_out);
#ifndef FRMS_SM90_LIGHT  // the CI compile check instantiates bf16 only (same template path, half the time)
  if (p->dtype == FRMS_DTYPE_F16) return run<cutlass::half_t>(*p, workspace_size_out);
#else
  if (p->dtype == FRMS_DTYPE_F16) return FRMS_ERR_NOT_BUILT;
#endif
  return FRMS_ERR_BAD_ARG;
}

#ifdef FRMS_SM90_LIGHT
// CI compile check (--light): one tile config per family (0..6 plain, 7..10 swap-AB) is compiled for real,
// and each unit defines the family's other entry points as forwarders to it, so the module links and
// every template path is still compiled once.
#define FRMS_FAMILY(c) ((c) <= 6 ? 0 : 1)
#define FRMS_FWD_OK(c) (FRMS_SM90_CFG != (c) && FRMS_FAMILY(c) == FRMS_FAMILY(FRMS_SM90_CFG))
#define FRMS_FORWARD(name) \
  extern "C" int name(const FrmsSm90Args* p, size_t* ws) { return FRMS_ENTRY(p, ws); }
#if FRMS_FWD_OK(0)
FRMS_FORWARD(frms_gemm_sm90_cfg0)
#endif
#if FRMS_FWD_OK(1)
FRMS_FORWARD(frms_gemm_sm90_cfg1)
#endif
#if FRMS_FWD_OK(2)
FRMS_FORWARD(frms_gemm_sm90_cfg2)
#endif
#if FRMS_FWD_OK(3)
FRMS_FORWARD(frms_gemm_sm90_cfg3)
#endif
#if FRMS_FWD_OK(4)
FRMS_FORWARD(frms_gemm_sm90_cfg4)
#endif
#if FRMS_FWD_OK(5)
FRMS_FORWARD(frms_gemm_sm90_cfg5)
#endif
#if FRMS_FWD_OK(6)
FRMS_FORWARD(frms_gemm_sm90_cfg6)
#endif
#if FRMS_FWD_OK(7)
FRMS_FORWARD(frms_gemm_sm90_cfg7)
#endif
#if FRMS_FWD_OK(8)
FRMS_FORWARD(frms_gemm_sm90_cfg8)
#endif
#if FRMS_FWD_OK(9)
FRMS_FORWARD(frms_gemm_sm90_cfg9)
#endif
#if FRMS_FWD_OK(10)
FRMS_FORWARD(frms_gemm_sm90_cfg10)
#endif
#endif
