// Device memory for the GPU tests: an owning buffer with host copies in and out, and the check
// that skips GPU tests on machines without a device.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashattn::test {

inline bool gpu_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    cuda_check(cudaMalloc(&ptr_, bytes() ? bytes() : 1), "cudaMalloc");
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    cuda_check(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return count_ * sizeof(T); }
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    cuda_check(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t count_ = 0;
};

}  // namespace flashattn::test
