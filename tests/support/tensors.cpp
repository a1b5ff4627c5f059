#include "support/tensors.h"

#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>

#include "core/dtype.h"

namespace flashattn::test {
namespace {

constexpr int kReportedElements = 5;

size_t size_of(flashattn_dtype t) { return t == FLASHATTN_DTYPE_FLOAT16 || t == FLASHATTN_DTYPE_BFLOAT16 ? 2 : 4; }

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int i = int(shape.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * shape[i + 1];
  return strides;
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

}  // namespace

const char* layout_name(Layout l) { return l == Layout::bshd ? "bshd" : "bhsd"; }

std::string format_index(const std::vector<int64_t>& index) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < index.size(); ++i) s << (i ? ", " : "") << index[i];
  s << "]";
  return s.str();
}

HostTensor::HostTensor(flashattn_dtype dtype, std::vector<int64_t> shape, std::vector<int64_t> strides,
                       int64_t elements) {
  if (shape.size() != strides.size() || shape.size() > FLASHATTN_MAX_RANK)
    throw std::invalid_argument("HostTensor: shape and strides must have the same rank <= 4");
  view_.dtype = dtype;
  view_.device = FLASHATTN_DEVICE_CPU;
  view_.rank = int32_t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    view_.shape[i] = shape[i];
    view_.strides[i] = strides[i];
  }
  storage_bytes_ = size_t(elements) * size_of(dtype);
  storage_.assign((storage_bytes_ + 7) / 8, 0);
  view_.data = storage_.empty() ? nullptr : storage_.data();
  poison();
}

HostTensor HostTensor::sequences(flashattn_dtype dtype, Layout layout, int64_t batch, int64_t seq, int64_t heads,
                                 int64_t dim, int64_t pad) {
  const int64_t row = dim + pad;
  std::vector<int64_t> strides = layout == Layout::bshd
                                     ? std::vector<int64_t>{seq * heads * row, heads * row, row, 1}
                                     : std::vector<int64_t>{heads * seq * row, row, seq * row, 1};
  return HostTensor(dtype, {batch, seq, heads, dim}, strides, batch * seq * heads * row);
}

HostTensor HostTensor::packed_sequences(flashattn_dtype dtype, Layout layout, int64_t total, int64_t heads,
                                        int64_t dim, int64_t pad) {
  const int64_t row = dim + pad;
  std::vector<int64_t> strides =
      layout == Layout::bshd ? std::vector<int64_t>{heads * row, row, 1} : std::vector<int64_t>{row, total * row, 1};
  return HostTensor(dtype, {total, heads, dim}, strides, total * heads * row);
}

HostTensor HostTensor::lse(int64_t batch, int64_t heads, int64_t seq, int64_t pad) {
  const int64_t row = seq + pad;
  return HostTensor(FLASHATTN_DTYPE_FLOAT32, {batch, heads, seq}, {heads * row, row, 1}, batch * heads * row);
}

HostTensor HostTensor::lse_packed(int64_t heads, int64_t total, int64_t pad) {
  return HostTensor(FLASHATTN_DTYPE_FLOAT32, {heads, total}, {total + pad, 1}, heads * (total + pad));
}

HostTensor HostTensor::int32(const std::vector<int32_t>& values) {
  const int64_t n = int64_t(values.size());
  HostTensor t(FLASHATTN_DTYPE_INT32, {n}, {1}, n);
  if (n) std::memcpy(t.data(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

HostTensor HostTensor::float32(const std::vector<float>& values, const std::vector<int64_t>& shape) {
  if (product(shape) != int64_t(values.size())) throw std::invalid_argument("HostTensor::float32: size mismatch");
  HostTensor t(FLASHATTN_DTYPE_FLOAT32, shape, contiguous_strides(shape), int64_t(values.size()));
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

flashattn_tensor HostTensor::view_on(void* data, flashattn_device device, int32_t device_index) const {
  flashattn_tensor t = view_;
  t.data = data;
  t.device = device;
  t.device_index = device_index;
  return t;
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < view_.rank; ++i) n *= view_.shape[i];
  return n;
}

size_t HostTensor::element_size() const { return size_of(view_.dtype); }

int64_t HostTensor::element_offset(const std::vector<int64_t>& index) const {
  if (int(index.size()) != view_.rank) throw std::invalid_argument("HostTensor: index rank mismatch");
  int64_t off = 0;
  for (int i = 0; i < view_.rank; ++i) {
    if (index[i] < 0 || index[i] >= view_.shape[i]) throw std::out_of_range("HostTensor: index " + format_index(index));
    off += index[i] * view_.strides[i];
  }
  return off;
}

static float read(const void* base, flashattn_dtype t, int64_t off) {
  if (t == FLASHATTN_DTYPE_INT32) return float(static_cast<const int32_t*>(base)[off]);
  return load_element(base, DType(t), off);
}

static void write(void* base, flashattn_dtype t, int64_t off, float value) {
  if (t == FLASHATTN_DTYPE_INT32) static_cast<int32_t*>(base)[off] = int32_t(value);
  else store_element(base, DType(t), off, value);
}

float HostTensor::at(const std::vector<int64_t>& index) const { return read(data(), dtype(), element_offset(index)); }
void HostTensor::set(const std::vector<int64_t>& index, float value) { write(data(), dtype(), element_offset(index), value); }

void HostTensor::for_each(const std::function<void(const std::vector<int64_t>&, int64_t)>& f) const {
  const int rank = view_.rank;
  if (numel() == 0) return;
  std::vector<int64_t> index(rank, 0);
  for (;;) {
    int64_t off = 0;
    for (int i = 0; i < rank; ++i) off += index[i] * view_.strides[i];
    f(index, off);
    int d = rank - 1;
    for (; d >= 0; --d) {
      if (++index[d] < view_.shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

std::vector<double> HostTensor::values() const {
  std::vector<double> out;
  out.reserve(size_t(numel()));
  for_each([&](const std::vector<int64_t>&, int64_t off) { out.push_back(read(data(), dtype(), off)); });
  return out;
}

void HostTensor::fill_normal(uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, stddev);
  for_each([&](const std::vector<int64_t>&, int64_t off) { write(data(), dtype(), off, normal(rng)); });
}

void HostTensor::fill_uniform(uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(lo, hi);
  for_each([&](const std::vector<int64_t>&, int64_t off) { write(data(), dtype(), off, uniform(rng)); });
}

void HostTensor::fill(float value) {
  for_each([&](const std::vector<int64_t>&, int64_t off) { write(data(), dtype(), off, value); });
}

void HostTensor::poison() {
  if (storage_bytes_) std::memset(storage_.data(), 0xFF, storage_bytes_);
}

std::vector<uint8_t> HostTensor::bytes() const {
  const auto* p = reinterpret_cast<const uint8_t*>(storage_.data());
  return std::vector<uint8_t>(p, p + storage_bytes_);
}

bool HostTensor::element_is_poison(int64_t offset) const {
  const auto* p = reinterpret_cast<const uint8_t*>(storage_.data()) + offset * element_size();
  for (size_t i = 0; i < element_size(); ++i)
    if (p[i] != 0xFF) return false;
  return true;
}

std::string HostTensor::unwritten_elements() const {
  std::ostringstream s;
  int64_t count = 0;
  for_each([&](const std::vector<int64_t>& index, int64_t off) {
    if (!element_is_poison(off)) return;
    if (count++ < kReportedElements) s << (count > 1 ? ", " : "") << format_index(index);
  });
  if (count == 0) return "";
  s << (count > kReportedElements ? ", ..." : "") << " (" << count << " of " << numel() << " elements unwritten)";
  return s.str();
}

std::string HostTensor::written_gaps() const {
  const int64_t elements = int64_t(storage_bytes_ / element_size());
  std::vector<bool> in_view(size_t(elements), false);
  for_each([&](const std::vector<int64_t>&, int64_t off) { in_view[size_t(off)] = true; });
  std::ostringstream s;
  int64_t count = 0;
  for (int64_t off = 0; off < elements; ++off) {
    if (in_view[size_t(off)] || element_is_poison(off)) continue;
    if (count++ < kReportedElements) s << (count > 1 ? ", " : "") << off;
  }
  if (count == 0) return "";
  s << (count > kReportedElements ? ", ..." : "") << " (" << count << " gap elements written; storage offsets)";
  return s.str();
}

}  // namespace flashattn::test
