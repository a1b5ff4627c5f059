// Where the tensors live and how calls are timed: host memory for the CPU backend, CUDA device
// memory (and CUDA events) for the CUDA backend. All CUDA code is compiled only with
// FLASHATTN_WITH_CUDA.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "flashattn/flashattn.h"

namespace flashattn::cli {

// Bytes in CUDA device memory; empty on a build without CUDA.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  DeviceBuffer(DeviceBuffer&&) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&&) noexcept;
  ~DeviceBuffer();

  void* data() const { return data_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;

 private:
  void* data_ = nullptr;
};

// Scratch memory for the library's workspace: 64-byte aligned host memory, or device memory.
class WorkspaceBuffer {
 public:
  WorkspaceBuffer() = default;
  WorkspaceBuffer(size_t bytes, bool on_cuda);
  void* data() const { return on_cuda_ ? device_.data() : host_.get(); }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  bool on_cuda_ = false;
  std::unique_ptr<void, Free> host_;
  DeviceBuffer device_;
};

// True when the CUDA backend was compiled in and a device is present.
bool cuda_backend_present();

// Which CUDA kernels run a problem's passes, in words (e.g. "sm90 forward (TMA, wgmma), sm80
// backward (mma.sync)").
std::string cuda_kernels(flashattn_dtype dtype, int head_dim, float dropout);

// Milliseconds of one call of `fn`, measured with CUDA events on the default stream when
// `on_cuda`, else with the host's steady clock.
double time_call_ms(const std::function<void()>& fn, bool on_cuda);

struct Timing {
  double ms = 0;  // median of the timed runs
  int runs = 0;
};

// One warm-up run, then `repeat` timed runs (0: as many as fit in about a second, at most 10;
// none when the warm-up alone took longer, whose time is then reported).
Timing measure(const std::function<void()>& fn, bool on_cuda, int repeat);

}  // namespace flashattn::cli
