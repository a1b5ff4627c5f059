// Header-only C++ layer over the C API: tensor views, fluent options, exceptions that carry the
// status and the library's message.
//
//   flashattn::Tensor q = flashattn::Tensor::bshd(q_ptr, batch, seqlen, heads, dim);
//   ...
//   flashattn::forward(q, k, v, out, &lse, flashattn::Options().causal().softcap(30.f));
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "flashattn/flashattn.h"

namespace flashattn {

class Error : public std::runtime_error {
 public:
  Error(flashattn_status status, const std::string& message)
      : std::runtime_error(std::string(flashattn_status_string(status)) + ": " + message), status_(status) {}
  flashattn_status status() const noexcept { return status_; }

 private:
  flashattn_status status_;
};

inline void check(flashattn_status status) {
  if (status != FLASHATTN_SUCCESS) throw Error(status, flashattn_last_error());
}

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr flashattn_dtype value = FLASHATTN_DTYPE_FLOAT32; };
template <> struct dtype_of<int32_t> { static constexpr flashattn_dtype value = FLASHATTN_DTYPE_INT32; };

// A view of caller-owned memory; copies are cheap and never own data.
class Tensor {
 public:
  Tensor() = default;
  // Row-major (contiguous) when `strides` is empty; strides are in elements.
  Tensor(void* data, flashattn_dtype dtype, std::initializer_list<int64_t> shape,
         std::initializer_list<int64_t> strides = {}, flashattn_device device = FLASHATTN_DEVICE_CPU,
         int device_index = 0) {
    if (shape.size() > FLASHATTN_MAX_RANK) throw std::invalid_argument("flashattn::Tensor: rank above 4");
    if (strides.size() != 0 && strides.size() != shape.size())
      throw std::invalid_argument("flashattn::Tensor: strides and shape differ in length");
    t_.data = data;
    t_.dtype = dtype;
    t_.device = device;
    t_.device_index = device_index;
    t_.rank = int32_t(shape.size());
    int i = 0;
    for (int64_t s : shape) t_.shape[i++] = s;
    if (strides.size() == 0) {
      int64_t step = 1;
      for (int d = t_.rank - 1; d >= 0; --d) t_.strides[d] = step, step *= t_.shape[d];
    } else {
      i = 0;
      for (int64_t s : strides) t_.strides[i++] = s;
    }
  }
  template <typename T>
  Tensor(T* data, std::initializer_list<int64_t> shape, std::initializer_list<int64_t> strides = {})
      : Tensor(const_cast<void*>(static_cast<const void*>(data)), dtype_of<std::remove_const_t<T>>::value, shape,
               strides) {}

  // [batch, seqlen, heads, dim] stored in that order (flash-attn's layout).
  static Tensor bshd(void* data, flashattn_dtype dtype, int64_t b, int64_t s, int64_t h, int64_t d,
                     flashattn_device device = FLASHATTN_DEVICE_CPU) {
    return Tensor(data, dtype, {b, s, h, d}, {}, device);
  }
  // [batch, heads, seqlen, dim] storage (PyTorch SDPA's layout) viewed as [batch, seqlen, heads, dim].
  static Tensor bhsd(void* data, flashattn_dtype dtype, int64_t b, int64_t h, int64_t s, int64_t d,
                     flashattn_device device = FLASHATTN_DEVICE_CPU) {
    return Tensor(data, dtype, {b, s, h, d}, {h * s * d, d, s * d, 1}, device);
  }

  const flashattn_tensor* get() const { return &t_; }
  flashattn_tensor* get() { return &t_; }
  int64_t size(int dim) const { return t_.shape[dim]; }
  int64_t stride(int dim) const { return t_.strides[dim]; }
  int rank() const { return t_.rank; }

 private:
  flashattn_tensor t_{};
};

// flashattn_options with fluent setters. Tensors passed here must outlive the call they serve.
class Options {
 public:
  Options() { flashattn_options_init(&o_); }
  Options& scale(float s) { o_.softmax_scale = s; return *this; }
  Options& causal(bool on = true) { o_.causal = on ? 1 : 0; return *this; }
  Options& window(int left, int right) { o_.window_left = left; o_.window_right = right; return *this; }
  Options& softcap(float cap) { o_.softcap = cap; return *this; }
  Options& alibi(const Tensor& slopes) { o_.alibi_slopes = slopes.get(); return *this; }
  Options& dropout(float p, uint64_t seed, uint64_t offset = 0) {
    o_.dropout_p = p; o_.dropout_seed = seed; o_.dropout_offset = offset;
    return *this;
  }
  Options& varlen(const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, int max_seqlen_q, int max_seqlen_k) {
    o_.cu_seqlens_q = cu_seqlens_q.get(); o_.cu_seqlens_k = cu_seqlens_k.get();
    o_.max_seqlen_q = max_seqlen_q; o_.max_seqlen_k = max_seqlen_k;
    return *this;
  }
  Options& backend(flashattn_backend b) { o_.backend = b; return *this; }
  Options& deterministic(bool on = true) { o_.deterministic = on ? 1 : 0; return *this; }
  Options& stream(void* cuda_stream) { o_.cuda_stream = cuda_stream; return *this; }
  Options& workspace(void* ptr, size_t bytes) { o_.workspace = ptr; o_.workspace_size = bytes; return *this; }
  Options& threads(int n) { o_.num_threads = n; return *this; }

  const flashattn_options* get() const { return &o_; }

 private:
  flashattn_options o_;
};

// out = attention(q, k, v); lse (optional) receives each row's log-sum-exp.
inline void forward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor* lse = nullptr,
                    const Options& options = Options()) {
  check(flashattn_forward(q.get(), k.get(), v.get(), out.get(), lse ? lse->get() : nullptr, options.get()));
}

inline void backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv, const Options& options = Options()) {
  check(flashattn_backward(dout.get(), q.get(), k.get(), v.get(), out.get(), lse.get(), dq.get(), dk.get(), dv.get(),
                           options.get()));
}

inline size_t forward_workspace_size(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor* lse = nullptr, const Options& options = Options()) {
  size_t bytes = 0;
  check(flashattn_forward_workspace_size(q.get(), k.get(), v.get(), out.get(), lse ? lse->get() : nullptr,
                                         options.get(), &bytes));
  return bytes;
}

// Whether the problem runs (on options' backend, or any); the reason is in flashattn_last_error().
inline bool supports(flashattn_pass pass, const Tensor& q, const Tensor& k, const Tensor& v,
                     const Options& options = Options()) {
  return flashattn_supports(pass, q.get(), k.get(), v.get(), options.get()) == FLASHATTN_SUCCESS;
}

inline std::string version() { return flashattn_version_string(); }

}  // namespace flashattn
