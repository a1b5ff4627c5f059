#include "device.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>
#include <vector>

#include "errors.h"

#if defined(FLASHATTN_WITH_CUDA)
#include <cuda_runtime.h>

#include "cuda/dispatch.h"
#endif

namespace flashattn::cli {

#if defined(FLASHATTN_WITH_CUDA)
namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) fail(what, " failed: ", cudaGetErrorString(err));
}

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes > 0) check_cuda(cudaMalloc(&data_, bytes), concat("cudaMalloc of ", bytes, " bytes").c_str());
}
DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}
void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes > 0) check_cuda(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > 0) check_cuda(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the device");
}

bool cuda_backend_present() { return flashattn_backend_available(FLASHATTN_BACKEND_CUDA) != 0; }

std::string cuda_kernels(flashattn_dtype dtype, int head_dim, float dropout) {
  Params p;
  p.pass = Pass::forward;
  p.dtype = DType(dtype);
  p.head_dim = p.head_dim_v = head_dim;
  p.dropout_p = dropout;
  p.device = FLASHATTN_DEVICE_CUDA;
  const bool hopper_forward = std::string(cuda::forward_kernels(p)) == "sm90";
  p.pass = Pass::backward;
  const bool hopper_backward = std::string(cuda::backward_kernels(p)) == "sm90";
  if (!hopper_forward && !hopper_backward) return "sm80 kernels (mma.sync)";
  return std::string(hopper_forward ? "sm90 forward (TMA, wgmma)" : "sm80 forward (mma.sync)") + ", " +
         (hopper_backward ? "sm90 backward (TMA, wgmma)" : "sm80 backward (mma.sync)");
}

double time_call_ms(const std::function<void()>& fn, bool on_cuda) {
  if (!on_cuda) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  check_cuda(cudaEventRecord(start), "cudaEventRecord");
  fn();
  check_cuda(cudaEventRecord(stop), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

#else

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (bytes > 0) fail("CUDA memory requested, but flashattn was built without CUDA");
}
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::upload(const void*, size_t bytes) {
  if (bytes > 0) fail("CUDA memory requested, but flashattn was built without CUDA");
}
void DeviceBuffer::download(void*, size_t bytes) const {
  if (bytes > 0) fail("CUDA memory requested, but flashattn was built without CUDA");
}

bool cuda_backend_present() { return false; }

std::string cuda_kernels(flashattn_dtype, int, float) { return "no CUDA kernels compiled"; }

double time_call_ms(const std::function<void()>& fn, bool) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

#endif

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept : data_(std::exchange(other.data_, nullptr)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(data_, other.data_);
  return *this;
}

void WorkspaceBuffer::Free::operator()(void* p) const { std::free(p); }

WorkspaceBuffer::WorkspaceBuffer(size_t bytes, bool on_cuda) : on_cuda_(on_cuda) {
  if (bytes == 0) return;
  if (on_cuda) {
    device_ = DeviceBuffer(bytes);
    return;
  }
  host_.reset(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
  if (!host_) fail("could not allocate ", bytes, " bytes of host memory for the workspace");
}

Timing measure(const std::function<void()>& fn, bool on_cuda, int repeat) {
  constexpr double kBudgetMs = 1000;
  constexpr int kMaxAutoRuns = 10;
  const double warmup = time_call_ms(fn, on_cuda);
  if (repeat == 0 && warmup >= kBudgetMs) return Timing{warmup, 1};
  std::vector<double> times;
  double spent = 0;
  while (repeat > 0 ? int(times.size()) < repeat
                    : int(times.size()) < kMaxAutoRuns && spent + warmup < kBudgetMs) {
    times.push_back(time_call_ms(fn, on_cuda));
    spent += times.back();
  }
  std::sort(times.begin(), times.end());
  return Timing{times[times.size() / 2], int(times.size())};
}

}  // namespace flashattn::cli
