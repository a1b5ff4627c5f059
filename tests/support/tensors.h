// Host buffers behind flashattn_tensor views, for the tests of every backend. A buffer may be
// larger than its view (BHSD strides, padded rows): the elements outside the view are gaps that
// stay poisoned, so a backend that reads them produces NaN and one that writes them is caught.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flashattn/flashattn.h"

namespace flashattn::test {

// Memory order of a [batch, seq, heads, dim] view: BSHD (flash-attn) or BHSD (PyTorch SDPA).
enum class Layout { bshd, bhsd };
const char* layout_name(Layout l);

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  HostTensor(HostTensor&&) = default;
  HostTensor& operator=(HostTensor&&) = default;

  // Any view: shape and strides in elements over a buffer of `elements` (poisoned).
  HostTensor(flashattn_dtype dtype, std::vector<int64_t> shape, std::vector<int64_t> strides, int64_t elements);

  // [batch, seq, heads, dim] (q, k, v, out and gradients); every dim row followed by `pad` gap elements.
  static HostTensor sequences(flashattn_dtype dtype, Layout layout, int64_t batch, int64_t seq, int64_t heads,
                              int64_t dim, int64_t pad = 0);
  // Variable length: [total, heads, dim]; BHSD stores heads outermost.
  static HostTensor packed_sequences(flashattn_dtype dtype, Layout layout, int64_t total, int64_t heads, int64_t dim,
                                     int64_t pad = 0);
  // lse: float32 [batch, heads, seq] (or [heads, total] when varlen), each row followed by `pad` gaps.
  static HostTensor lse(int64_t batch, int64_t heads, int64_t seq, int64_t pad = 0);
  static HostTensor lse_packed(int64_t heads, int64_t total, int64_t pad = 0);
  // Contiguous tensors holding the given values.
  static HostTensor int32(const std::vector<int32_t>& values);
  static HostTensor float32(const std::vector<float>& values, const std::vector<int64_t>& shape);

  // The descriptor to pass to the API. Stays valid while this object lives (moves included).
  flashattn_tensor* desc() { return &view_; }
  const flashattn_tensor* desc() const { return &view_; }
  // The same view over a copy of this buffer elsewhere (e.g. device memory of storage_bytes()).
  flashattn_tensor view_on(void* data, flashattn_device device, int32_t device_index) const;

  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  size_t storage_bytes() const { return storage_bytes_; }
  flashattn_dtype dtype() const { return view_.dtype; }
  int rank() const { return view_.rank; }
  int64_t size(int dim) const { return view_.shape[dim]; }
  int64_t numel() const;

  // Element at logical coordinates (one per dimension), read or written as float (int32 too).
  float at(const std::vector<int64_t>& index) const;
  void set(const std::vector<int64_t>& index, float value);
  // Calls f(index, storage offset) for every logical element, in row-major order of the shape.
  void for_each(const std::function<void(const std::vector<int64_t>&, int64_t)>& f) const;
  // Logical elements in row-major order of the shape.
  std::vector<double> values() const;

  // Logical elements drawn from N(0, stddev^2), rounded to the dtype; deterministic in `seed`.
  void fill_normal(uint64_t seed, float stddev = 1.f);
  void fill_uniform(uint64_t seed, float lo, float hi);
  void fill(float value);
  // Every byte 0xFF: a NaN in float32, float16 and bfloat16, -1 in int32.
  void poison();
  std::vector<uint8_t> bytes() const;

  // "" when every logical element was written (holds no poison), else the first few coordinates.
  std::string unwritten_elements() const;
  // "" when every gap element still holds poison, else the first few storage offsets written.
  std::string written_gaps() const;

 private:
  int64_t element_offset(const std::vector<int64_t>& index) const;
  bool element_is_poison(int64_t offset) const;
  size_t element_size() const;

  flashattn_tensor view_{};
  std::vector<uint64_t> storage_;  // 8-byte aligned backing
  size_t storage_bytes_ = 0;
};

std::string format_index(const std::vector<int64_t>& index);

}  // namespace flashattn::test
