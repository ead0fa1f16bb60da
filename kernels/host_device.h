// GPUCOMPUTE_HD marks a function of a header shared by the CPU backend and the CUDA
// kernels (kernels/philox.h, kernels/reduce_ops.h): a host-and-device function, always
// inlined, under nvcc; a plain inline function under the host compiler.
#ifndef GPUCOMPUTE_KERNELS_HOST_DEVICE_H_
#define GPUCOMPUTE_KERNELS_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define GPUCOMPUTE_HD __host__ __device__ __forceinline__
#else
#define GPUCOMPUTE_HD inline
#endif

#endif  // GPUCOMPUTE_KERNELS_HOST_DEVICE_H_
