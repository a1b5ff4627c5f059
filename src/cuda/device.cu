#include "cuda/device.h"

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

namespace flashattn::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a machine without a driver
    return 0;
  }
  return n;
}

DeviceInfo device_info(int index) {
  static std::mutex mutex;
  static std::vector<DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (index < 0) return {};
  if (size_t(index) < cache.size() && cache[index].multiprocessors > 0) return cache[index];
  DeviceInfo info;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&info.multiprocessors, cudaDevAttrMultiProcessorCount, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&info.max_smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  info.compute_capability = 10 * major + minor;
  if (cache.size() <= size_t(index)) cache.resize(index + 1);
  cache[index] = info;
  return info;
}

DeviceGuard::DeviceGuard(int index) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (previous_ != index) cudaSetDevice(index);
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

}  // namespace flashattn::cuda
