// Facts about the CUDA devices, read once per device and cached.
#pragma once

namespace flashattn::cuda {

struct DeviceInfo {
  int multiprocessors = 0;
  int max_smem_per_block = 0;  // bytes, with the opt-in for large dynamic shared memory
  int compute_capability = 0;  // 10 * major + minor
};

int device_count();
// Info of device `index`; all zeros when it cannot be read.
DeviceInfo device_info(int index);

// Makes `index` the current device for the guard's lifetime, then restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace flashattn::cuda
