// Default (wn, ksplit) of the tensor-core decode kernel: plain host C++, no CUDA, so a CPU test can
// compile it (tests/test_rmsnorm_linear.py::test_decode_mma_auto_config).
//
// The kernel streams W once; its bandwidth comes from the bytes each resident CTA keeps in flight,
// so the launch should be exactly one wave of resident CTAs. Measured on an H200 (132 SMs, 2 CTAs
// per SM): the best configs launch 224-256 CTAs; 128 CTAs (fewer than the SMs) or >= 448 CTAs (a
// second, partial wave) are 1.3-1.5x slower, e.g. D4096 N14336 M1: wn4 (224 CTAs) 36.5 us, wn2 (448)
// 38.0, wn8 (112) 54.9. Rule: among wn = 1/2/4/8 take the largest CTA count that still fits one wave
// (slots = resident CTAs per SM x SMs); split K over a thread-block cluster only when even wn = 1
// leaves SMs idle (N / 16 < SMs), doubling ksplit while the CTAs still fit one wave.
#pragma once
#include <cstdint>

namespace frms {

// M, N, K: problem; tok: tokens per CTA (8 / 16 / 32); clusters: ksplit > 1 possible; sms: SM count;
// per_sm: resident CTAs per SM (occupancy). wn / ks: in: 0 = choose, else fixed; out: the choice.
inline void decode_mma_auto_config(int64_t M, int64_t N, int64_t K, int tok, bool clusters, int sms, int per_sm,
                                   int& wn, int& ks) {
  const int64_t chunks = (M + tok - 1) / tok;
  const int64_t slots = int64_t(per_sm > 0 ? per_sm : 2) * int64_t(sms > 0 ? sms : 1);
  const int64_t steps = (K + 31) / 32;
  auto ctas = [&](int w) { return (N + 16 * w - 1) / (16 * w) * chunks; };
  if (wn <= 0) {
    const int64_t kf = ks > 0 ? ks : 1;
    wn = 8;  // nothing fits one wave: the fewest CTAs
    int64_t best = -1;
    for (int w = 8; w >= 1; w /= 2) {
      const int64_t c = ctas(w) * kf;
      if (c <= slots && c > best) {
        best = c;
        wn = w;
      }
    }
  }
  if (ks <= 0) {
    ks = 1;
    if (clusters) {
      const int64_t c = ctas(wn);
      const int64_t wk = 8 / wn;
      // each warp keeps >= 4 steps (one ring fill) of its K range
      while (ks < 8 && c * ks < sms && c * ks * 2 <= slots && steps / (int64_t(ks) * 2 * wk) >= 4) ks *= 2;
    }
  }
}

}  // namespace frms
