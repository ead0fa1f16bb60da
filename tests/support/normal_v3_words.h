// Philox words that exercise normal transform v3 (kernels/philox.h) where its table
// changes rows: for tests that hold the transform to a reference or a device to the CPU.
#ifndef GPUCOMPUTE_TESTS_SUPPORT_NORMAL_V3_WORDS_H_
#define GPUCOMPUTE_TESTS_SUPPORT_NORMAL_V3_WORDS_H_

#include <cstdint>
#include <vector>

namespace gpucompute::testing {

// The words, both signs, of every odd b (b = ~(2w) mod 2^32, kernels/philox.h) within `span`
// of either end of its segment: b's float32 exponent and next four bits.
inline std::vector<uint32_t> NormalV3SegmentEdgeWords(uint64_t span) {
  std::vector<uint32_t> words;
  for (uint32_t e = 0; e < 32; ++e) {
    const uint64_t width = e >= 4 ? uint64_t{1} << (e - 4) : 1;
    for (uint64_t lo = uint64_t{1} << e; lo < (uint64_t{2} << e); lo += width) {
      for (uint64_t d = 0; d < span && d < width; ++d) {
        for (uint64_t b : {lo + d, lo + width - 1 - d}) {
          if (b % 2 == 0) continue;
          const uint32_t w = ~static_cast<uint32_t>(b) >> 1;
          words.push_back(w);
          words.push_back(w | 0x80000000u);
        }
      }
    }
  }
  return words;
}

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_SUPPORT_NORMAL_V3_WORDS_H_
