// ElementwiseAsync and ElementwiseStridedAsync: the entry points and their dispatch. The
// kernels are generated at run time from kernels/cuda/elementwise/ (ElementwiseKernelSource,
// ElementwiseStridedKernelSource) and compiled with NVRTC by the server, which loads them
// and passes them here; this file only launches them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/kernels.h"

namespace gpucompute::cuda {
namespace detail {
namespace {

// Resident blocks per SM when the runtime cannot say: 8 blocks of 256 threads fill an
// SM's 2048 thread slots on sm_80/sm_90.
constexpr int kFallbackBlocksPerSm = 8;
// The grid is at most this many times the resident blocks: blocks that finish early take
// the next from the hardware's queue, which evens out SMs that run slower (math-bound
// expressions diverge in their slow paths). 16 rather than 4 waves: shorter loops per
// block ran both memory-bound and math-bound contiguous kernels faster
// (kernels/PERFORMANCE.md). The rows kernel is the exception (below).
constexpr int64_t kWaves = 16;

// The most blocks a grid's x dimension takes.
constexpr int64_t kMaxGridX = 0x7fffffff;

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Blocks of the launch: enough for every thread-iteration of work, at most kWaves waves.
unsigned ElementwiseGrid(int64_t work, int64_t threads, int64_t blocks_per_sm, int sm_count) {
  const int64_t blocks = std::clamp<int64_t>(
      std::min(CeilDiv(work, threads), int64_t{sm_count} * blocks_per_sm * kWaves), 1,
      kMaxGridX);
  return static_cast<unsigned>(blocks);
}

// The strided kernel's 2-D blocks: x threads along a row and y rows, x * y = `threads`
// (a power of two). x covers a row's thread-iterations (a power of two up to
// `max_x`), so that short rows do not leave most of a block idle: rows of one pack get
// one thread each.
dim3 StridedBlock(int64_t iterations_per_row, int threads, int max_x) {
  int64_t x = 1;
  while (x < iterations_per_row && x < max_x) x *= 2;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(threads / x));
}

// Blocks along one grid axis for `work` blocks' worth at most `limit`: as many passes as
// the limit needs, each of the same number of blocks, so that no block has a pass more
// than the others (8192 rows over 264 blocks would give some 32 passes and most 31).
int64_t EvenGrid(int64_t work, int64_t limit) {
  const int64_t passes = CeilDiv(work, limit);
  return CeilDiv(work, passes);
}

// At most a warp along the row when an array gathers: the block's 8 rows then read (and
// write) the neighbouring elements of each 32-byte sector of a transposed array at about
// the same time, so that a sector fetched for one row serves the others from cache.
constexpr int kGatherBlockX = 32;

// Args of strided.cuh.in, word by word.
std::vector<int64_t> StridedArgs(size_t num_arrays, int dims, const int64_t* shape, int64_t rows,
                                 const StridedArray* arrays, const StridedArray& out) {
  std::vector<int64_t> words;
  words.reserve(3 * dims + 1 + (num_arrays + 1) * (dims + 1));
  words.insert(words.end(), shape, shape + dims);
  std::vector<FastDivisor> divisors;
  for (int d = 0; d < dims; ++d) divisors.push_back(MakeFastDivisor(shape[d]));
  for (const FastDivisor& f : divisors) words.push_back(static_cast<int64_t>(f.magic));
  for (const FastDivisor& f : divisors) words.push_back(f.shift);
  words.push_back(rows);
  auto append_layout = [&](const StridedArray& array) {
    words.insert(words.end(), array.strides, array.strides + dims);
    words.push_back(array.offset);
  };
  for (size_t a = 0; a < num_arrays; ++a) append_layout(arrays[a]);
  append_layout(out);
  return words;
}

// Args of rows.cuh.in, word by word: rows, packs per row, then each layout's row stride
// and offset.
std::vector<int64_t> RowsArgs(const ElementwiseSignature& sig, const int64_t* shape,
                              const StridedArray* arrays, const StridedArray& out) {
  std::vector<int64_t> words = {shape[0], shape[1] / sig.elements_per_pack};
  for (size_t a = 0; a < sig.array_inputs.size(); ++a) {
    words.insert(words.end(), {arrays[a].strides[0], arrays[a].offset});
  }
  words.insert(words.end(), {out.strides[0], out.offset});
  return words;
}

}  // namespace
}  // namespace detail

int ElementwiseBlocksPerSm(cudaKernel_t kernel, int threads) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(kernel),
                                                    threads, 0) != cudaSuccess ||
      blocks <= 0) {
    cudaGetLastError();
    return detail::kFallbackBlocksPerSm;
  }
  return blocks;
}

cudaError_t ElementwiseAsync(const ElementwiseSignature& signature,
                             const ElementwiseKernelPair& kernels, const void* const* arrays,
                             void* out, int64_t n, const uint64_t* parameters, int sm_count,
                             cudaStream_t stream) {
  if (n < 0 || sm_count <= 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const ElementwiseSignature& sig = signature;
  const size_t num_arrays = sig.array_inputs.size();
  const size_t num_parameters = sig.parameter_dtypes.size();
  // A constant array's one element is read as a scalar, so its alignment does not matter.
  bool aligned = detail::Aligned16(out);
  for (size_t a = 0; a < num_arrays; ++a) {
    const bool constant = a < sig.array_constant.size() && sig.array_constant[a];
    aligned = aligned && (constant || detail::Aligned16(arrays[a]));
  }
  // Thread-iterations of work: a thread of the vectorised kernel handles packs_per_thread
  // packs of elements_per_pack elements per iteration.
  const int64_t per_thread =
      aligned ? int64_t{sig.elements_per_pack} * sig.packs_per_thread : int64_t{1};
  const int64_t threads = sig.threads_per_block;
  const int64_t work = detail::CeilDiv(n, per_thread);
  const int64_t blocks_per_sm =
      aligned ? kernels.vector_blocks_per_sm : kernels.scalar_blocks_per_sm;
  const unsigned grid = detail::ElementwiseGrid(work, threads, blocks_per_sm, sm_count);

  // The kernel's arguments, each by address (see ElementwiseSignature); the runtime reads
  // them and never writes.
  std::vector<void*> args;
  args.reserve(num_arrays + 2 + num_parameters);
  for (size_t a = 0; a < num_arrays; ++a) args.push_back(const_cast<const void**>(&arrays[a]));
  args.push_back(&out);
  args.push_back(&n);
  for (size_t p = 0; p < num_parameters; ++p) {
    args.push_back(const_cast<uint64_t*>(&parameters[p]));
  }
  const cudaKernel_t function = aligned ? kernels.vector_kernel : kernels.scalar_kernel;
  return cudaLaunchKernel(reinterpret_cast<const void*>(function), dim3(grid),
                          dim3(static_cast<unsigned>(threads)), args.data(), 0, stream);
}

FastDivisor MakeFastDivisor(int64_t d) {
  // shift = ceil(log2 d); magic = floor(2^(64 + shift) / d) - 2^64 + 1, which fits 64 bits.
  __extension__ typedef unsigned __int128 Uint128;
  FastDivisor divisor;
  const auto u = static_cast<uint64_t>(std::max<int64_t>(d, 1));
  while (divisor.shift < 63 && (uint64_t{1} << divisor.shift) < u) ++divisor.shift;
  const Uint128 quotient = (Uint128{1} << (64 + divisor.shift)) / u;
  divisor.magic = static_cast<uint64_t>(quotient - (Uint128{1} << 64) + 1);
  return divisor;
}

cudaError_t ElementwiseStridedAsync(const ElementwiseSignature& signature,
                                    const StridedSpecialization& specialization,
                                    cudaKernel_t kernel, int blocks_per_sm, const int64_t* shape,
                                    const StridedArray* arrays, const StridedArray& out,
                                    const uint64_t* parameters, int sm_count,
                                    cudaStream_t stream) {
  const int dims = specialization.dims;
  if (dims < 1 || dims > kElementwiseMaxDims || sm_count <= 0 || blocks_per_sm <= 0) {
    return cudaErrorInvalidValue;
  }
  for (int d = 0; d < dims; ++d) {
    if (shape[d] < 0) return cudaErrorInvalidValue;
    if (shape[d] == 0) return cudaSuccess;
  }
  const ElementwiseSignature& sig = signature;
  const size_t num_arrays = sig.array_inputs.size();
  const size_t num_parameters = sig.parameter_dtypes.size();
  const bool rows_kernel = specialization.rows;
  // The rows kernel has no tail or alignment path: it must never see layouts it cannot read.
  if (rows_kernel &&
      (specialization.in_steps.size() != num_arrays ||
       !RowsLayoutsFit(specialization, shape, sig.array_dtypes, arrays, sig.out_dtype, out))) {
    return cudaErrorInvalidValue;
  }

  int64_t rows = 1;
  for (int d = 0; d + 1 < dims; ++d) rows *= shape[d];
  std::vector<int64_t> words =
      rows_kernel ? detail::RowsArgs(sig, shape, arrays, out)
                  : detail::StridedArgs(num_arrays, dims, shape, rows, arrays, out);

  // The grid: every pack of every row, at most kWaves waves of resident blocks; the
  // kernel's loops cover the rest. Rows beyond the grid's y limit loop too.
  const int64_t packs_per_row = detail::CeilDiv(shape[dims - 1], sig.elements_per_pack);
  const int64_t iterations_per_row = detail::CeilDiv(packs_per_row, sig.packs_per_thread);
  bool gathers = specialization.out_step == RowStep::kGather;
  for (RowStep step : specialization.in_steps) gathers = gathers || step == RowStep::kGather;
  const bool tiled =
      std::find(specialization.in_steps.begin(), specialization.in_steps.end(),
                RowStep::kTransposed) != specialization.in_steps.end();
  dim3 block = detail::StridedBlock(iterations_per_row, sig.threads_per_block,
                                    gathers ? detail::kGatherBlockX : sig.threads_per_block);
  // The rows kernel (broadcasts such as x - m, light per element) gets a block for every
  // tile of every row, one pass: it then keeps pace with the device copy, which a grid of
  // waves looping over the tiles does not. A contiguous kernel with no loop at all lost
  // time on math-bound expressions, so the others keep kWaves (kernels/PERFORMANCE.md).
  const int64_t max_blocks =
      rows_kernel ? detail::kMaxGridX : int64_t{sm_count} * blocks_per_sm * detail::kWaves;
  int64_t grid_x = detail::EvenGrid(detail::CeilDiv(iterations_per_row, block.x), max_blocks);
  int64_t grid_y = detail::EvenGrid(detail::CeilDiv(rows, block.y),
                                    std::clamp<int64_t>(max_blocks / grid_x, 1, 65535));
  if (tiled) {
    // The tiled kernel's shape (kTile and kTileRows in strided.cuh.in): 32 x 32 tiles,
    // blocks of 32 x 8 threads, a 1-D grid over the tiles.
    constexpr int64_t kTile = 32;
    block = dim3(kTile, static_cast<unsigned>(sig.threads_per_block / kTile));
    const int64_t tiles =
        detail::CeilDiv(rows, kTile) * detail::CeilDiv(shape[dims - 1], kTile);
    grid_x = detail::EvenGrid(tiles, max_blocks);
    grid_y = 1;
  }

  std::vector<void*> args;
  args.reserve(num_arrays + 2 + num_parameters);
  for (size_t a = 0; a < num_arrays; ++a) args.push_back(const_cast<const void**>(&arrays[a].data));
  args.push_back(const_cast<const void**>(&out.data));
  args.push_back(words.data());
  for (size_t p = 0; p < num_parameters; ++p) {
    args.push_back(const_cast<uint64_t*>(&parameters[p]));
  }
  return cudaLaunchKernel(reinterpret_cast<const void*>(kernel),
                          dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)), block,
                          args.data(), 0, stream);
}

}  // namespace gpucompute::cuda
