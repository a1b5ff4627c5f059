#include "cuda/device.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <vector>

namespace flashattn::cuda {

namespace {

// FLASHATTN_CUDA_MAX_SMEM=BYTES caps the shared memory per block the kernels plan with, so that a
// large GPU runs the configurations of a smaller one (166912 for an A100, 101376 for sm_86/89)
// in tests; 0 when unset or not a positive number. Read when a device is first queried.
int smem_cap() {
  const char* text = std::getenv("FLASHATTN_CUDA_MAX_SMEM");
  if (!text) return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && value > 0 && value < (1L << 30) ? int(value) : 0;
}

DeviceInfo capped(DeviceInfo info) {
  const int cap = smem_cap();
  if (cap > 0 && cap < info.max_smem_per_block) info.max_smem_per_block = cap;
  return info;
}

}  // namespace

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
  cache[index] = capped(info);  // the cap is read once, with the device
  return cache[index];
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
