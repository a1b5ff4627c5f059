#include "problem.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/dtype.h"
#include "core/semantics.h"
#include "core/validate.h"
#include "errors.h"

namespace flashattn::cli {
namespace {

flashattn_tensor make_tensor(flashattn_dtype dtype, std::initializer_list<int64_t> shape) {
  flashattn_tensor t{};
  t.dtype = dtype;
  t.rank = int32_t(shape.size());
  int i = 0;
  for (int64_t n : shape) t.shape[i++] = n;
  int64_t stride = 1;  // contiguous, last dimension fastest; empty dimensions count as 1
  for (int d = t.rank - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= std::max<int64_t>(t.shape[d], 1);
  }
  return t;
}

int64_t element_count(const flashattn_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.rank; ++i) n *= t.shape[i];
  return n;
}

size_t element_bytes(flashattn_dtype t) { return t == FLASHATTN_DTYPE_FLOAT16 || t == FLASHATTN_DTYPE_BFLOAT16 ? 2 : 4; }

// splitmix64: a fast, seedable stream of 64-bit values.
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-sqrt(3), sqrt(3)): zero mean, unit variance.
  float unit_variance() { return float((double(next() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * 1.7320508075688772); }
};

std::vector<int32_t> prefix_sums(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> cu(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), cu.begin() + 1);
  return cu;
}

// Visible (query, key) pairs of one sequence under `w`.
double visible_pairs(const semantics::Window& w) {
  double pairs = 0;
  for (int64_t i = 0; i < w.seqlen_q; ++i) pairs += double(std::max<int64_t>(0, w.last_key(i) - w.first_key(i) + 1));
  return pairs;
}

double sequence_pairs(const ProblemSpec& s, int seqlen_q, int seqlen_k) {
  const bool plain_causal = s.causal && s.window.left < 0;
  if (plain_causal && seqlen_q == seqlen_k) return 0.5 * double(seqlen_q) * seqlen_k;
  if (!s.causal && s.window.left < 0 && s.window.right < 0) return double(seqlen_q) * seqlen_k;
  return visible_pairs(semantics::Window{s.window.left, s.causal ? 0 : s.window.right, seqlen_q, seqlen_k});
}

}  // namespace

std::string ProblemSpec::describe() const {
  std::ostringstream s;
  s << "B=" << batch << " Hq=" << heads_q << " Hkv=" << heads_kv << " Nq=" << seqlen_q << " Nk=" << seqlen_k
    << " d=" << head_dim << " " << dtype_name(dtype);
  if (causal) s << " causal";
  if (window.left >= 0 || window.right >= 0) s << " window=(" << window.left << "," << window.right << ")";
  if (softcap > 0) s << " softcap=" << softcap;
  if (alibi) s << " alibi";
  if (dropout > 0) s << " dropout=" << dropout;
  if (varlen()) s << " varlen";
  return s.str();
}

ProblemSpec with_flags(ProblemSpec s, const ProblemFlags& f) {
  if (f.batch) s.batch = *f.batch;
  if (f.heads) s.heads_q = s.heads_kv = *f.heads;
  if (f.kv_heads) s.heads_kv = *f.kv_heads;
  if (f.seqlen_q) s.seqlen_q = *f.seqlen_q;
  if (f.seqlen_k) s.seqlen_k = *f.seqlen_k;
  if (f.head_dim) s.head_dim = *f.head_dim;
  if (f.dtype) s.dtype = *f.dtype;
  if (f.window) {
    s.window = *f.window;
    s.causal = false;
  }
  if (f.causal) s.causal = *f.causal;
  if (f.softcap) s.softcap = *f.softcap;
  if (f.dropout) s.dropout = *f.dropout;
  if (f.alibi) s.alibi = true;
  return s;
}

double forward_flops(const ProblemSpec& s) {
  double pairs = 0;
  if (s.varlen())
    for (size_t b = 0; b < s.varlen_q.size(); ++b) pairs += sequence_pairs(s, s.varlen_q[b], s.varlen_k[b]);
  else
    pairs = s.batch * sequence_pairs(s, s.seqlen_q, s.seqlen_k);
  return 4.0 * s.head_dim * s.heads_q * pairs;  // QK^T and PV: 2 * d FLOPs per pair each
}

double backward_flops(const ProblemSpec& s) { return 2.5 * forward_flops(s); }

flashattn_backend resolve_backend(flashattn_backend requested) {
  switch (requested) {
    case FLASHATTN_BACKEND_AUTO:
      return cuda_backend_present() ? FLASHATTN_BACKEND_CUDA : FLASHATTN_BACKEND_CPU;
    case FLASHATTN_BACKEND_CPU:
      return FLASHATTN_BACKEND_CPU;
    case FLASHATTN_BACKEND_CUDA:
#if !defined(FLASHATTN_WITH_CUDA)
      fail("--backend cuda: this flashattn was built without CUDA");
#else
      if (!cuda_backend_present()) fail("--backend cuda: no CUDA device is available");
      return FLASHATTN_BACKEND_CUDA;
#endif
  }
  return FLASHATTN_BACKEND_CPU;
}

size_t Problem::Tensor::bytes() const {
  return desc.rank == 0 ? 0 : size_t(element_count(desc)) * element_bytes(desc.dtype);
}

flashattn_tensor Problem::Tensor::host_view() const {
  flashattn_tensor t = desc;
  t.data = const_cast<std::byte*>(host.data());
  t.device = FLASHATTN_DEVICE_CPU;
  t.device_index = 0;
  return t;
}

Problem::Problem(const ProblemSpec& spec, flashattn_backend backend, int threads, bool with_backward)
    : spec_(spec), backend_(backend), with_backward_(with_backward) {
  if (spec_.varlen()) {
    cu_seqlens_q_ = prefix_sums(spec_.varlen_q);
    cu_seqlens_k_ = prefix_sums(spec_.varlen_k);
  }
  describe_tensors();
  flashattn_options_init(&options_);
  options_.causal = spec_.causal;
  options_.window_left = spec_.window.left;
  options_.window_right = spec_.window.right;
  options_.softcap = spec_.softcap;
  options_.alibi_slopes = spec_.alibi ? &alibi_.desc : nullptr;
  options_.dropout_p = spec_.dropout;
  options_.dropout_seed = spec_.seed;
  if (spec_.varlen()) {
    options_.cu_seqlens_q = &cu_q_.desc;
    options_.cu_seqlens_k = &cu_k_.desc;
    options_.max_seqlen_q = spec_.seqlen_q;
    options_.max_seqlen_k = spec_.seqlen_k;
  }
  options_.backend = backend_;
  options_.num_threads = threads;
  query_workspaces();  // validates everything before a byte is allocated
  workspace_ = WorkspaceBuffer(std::max(forward_workspace_, backward_workspace_), on_cuda());

  for (Tensor* t : {&q_, &k_, &v_, &out_, &lse_}) allocate(*t);
  if (with_backward_)
    for (Tensor* t : {&dout_, &dq_, &dk_, &dv_}) allocate(*t);
  fill_random(q_, 1);
  fill_random(k_, 2);
  fill_random(v_, 3);
  if (with_backward_) fill_random(dout_, 4);
  if (spec_.alibi) {
    allocate(alibi_);
    auto* slopes = reinterpret_cast<float*>(alibi_.host.data());
    for (int h = 0; h < spec_.heads_q; ++h) slopes[h] = std::exp2(-8.0f * float(h + 1) / float(spec_.heads_q));
    upload(alibi_);
  }
  if (spec_.varlen()) {
    allocate(cu_q_);
    allocate(cu_k_);
    std::copy_n(reinterpret_cast<const std::byte*>(cu_seqlens_q_.data()), cu_q_.bytes(), cu_q_.host.data());
    std::copy_n(reinterpret_cast<const std::byte*>(cu_seqlens_k_.data()), cu_k_.bytes(), cu_k_.host.data());
    upload(cu_q_);
    upload(cu_k_);
  }
}

// Shapes of every tensor, data pointers still null.
void Problem::describe_tensors() {
  const ProblemSpec& s = spec_;
  const flashattn_dtype dt = s.dtype;
  const int64_t d = s.head_dim;
  if (s.varlen()) {
    const int64_t total_q = cu_seqlens_q_.back(), total_k = cu_seqlens_k_.back();
    q_.desc = make_tensor(dt, {total_q, s.heads_q, d});
    k_.desc = make_tensor(dt, {total_k, s.heads_kv, d});
    lse_.desc = make_tensor(FLASHATTN_DTYPE_FLOAT32, {s.heads_q, total_q});
    cu_q_.desc = make_tensor(FLASHATTN_DTYPE_INT32, {int64_t(cu_seqlens_q_.size())});
    cu_k_.desc = make_tensor(FLASHATTN_DTYPE_INT32, {int64_t(cu_seqlens_k_.size())});
  } else {
    q_.desc = make_tensor(dt, {s.batch, s.seqlen_q, s.heads_q, d});
    k_.desc = make_tensor(dt, {s.batch, s.seqlen_k, s.heads_kv, d});
    lse_.desc = make_tensor(FLASHATTN_DTYPE_FLOAT32, {s.batch, s.heads_q, s.seqlen_q});
  }
  out_.desc = dout_.desc = dq_.desc = q_.desc;
  v_.desc = dk_.desc = dv_.desc = k_.desc;
  alibi_.desc = make_tensor(FLASHATTN_DTYPE_FLOAT32, {s.heads_q});
  const flashattn_device device = on_cuda() ? FLASHATTN_DEVICE_CUDA : FLASHATTN_DEVICE_CPU;
  for (Tensor* t : {&q_, &k_, &v_, &out_, &lse_, &dout_, &dq_, &dk_, &dv_, &cu_q_, &cu_k_, &alibi_})
    t->desc.device = device;
}

void Problem::query_workspaces() {
  require_ok(flashattn_forward_workspace_size(&q_.desc, &k_.desc, &v_.desc, &out_.desc, &lse_.desc, &options_,
                                              &forward_workspace_),
             "flashattn_forward_workspace_size");
  if (with_backward_)
    require_ok(flashattn_backward_workspace_size(&dout_.desc, &q_.desc, &k_.desc, &v_.desc, &out_.desc, &lse_.desc,
                                                 &dq_.desc, &dk_.desc, &dv_.desc, &options_, &backward_workspace_),
               "flashattn_backward_workspace_size");
}

void Problem::allocate(Tensor& t) {
  try {
    t.host.resize(t.bytes());
  } catch (const std::bad_alloc&) {
    fail("could not allocate ", t.bytes(), " bytes of host memory for the problem's tensors");
  }
  if (on_cuda()) {
    t.device = DeviceBuffer(t.bytes());
    t.desc.data = t.device.data();
  } else {
    t.desc.data = t.host.data();
  }
}

void Problem::fill_random(Tensor& t, uint64_t stream) {
  SplitMix rng{spec_.seed * 0x100000001B3ull + stream};
  const int64_t n = element_count(t.desc);
  for (int64_t i = 0; i < n; ++i) store_element(t.host.data(), DType(t.desc.dtype), i, rng.unit_variance());
  upload(t);
}

void Problem::upload(Tensor& t) {
  if (on_cuda()) t.device.upload(t.host.data(), t.bytes());
}

void Problem::fetch(Tensor& t) {
  if (on_cuda()) t.device.download(t.host.data(), t.bytes());
}

void Problem::use_workspace(size_t bytes) {
  options_.workspace = bytes > 0 ? workspace_.data() : nullptr;
  options_.workspace_size = bytes;
}

void Problem::forward() {
  use_workspace(forward_workspace_);
  require_ok(flashattn_forward(&q_.desc, &k_.desc, &v_.desc, &out_.desc, &lse_.desc, &options_), "flashattn_forward");
}

void Problem::backward() {
  use_workspace(backward_workspace_);
  require_ok(flashattn_backward(&dout_.desc, &q_.desc, &k_.desc, &v_.desc, &out_.desc, &lse_.desc, &dq_.desc,
                                &dk_.desc, &dv_.desc, &options_),
             "flashattn_backward");
}

void Problem::fetch_outputs() {
  fetch(out_);
  fetch(lse_);
}

void Problem::fetch_gradients() {
  fetch(dq_);
  fetch(dk_);
  fetch(dv_);
}

Params Problem::host_params(Pass pass) const {
  const flashattn_tensor q = q_.host_view(), k = k_.host_view(), v = v_.host_view(), out = out_.host_view(),
                         lse = lse_.host_view(), dout = dout_.host_view(), dq = dq_.host_view(),
                         dk = dk_.host_view(), dv = dv_.host_view(), cu_q = cu_q_.host_view(),
                         cu_k = cu_k_.host_view(), alibi = alibi_.host_view();
  flashattn_options options = options_;
  options.alibi_slopes = spec_.alibi ? &alibi : nullptr;
  if (spec_.varlen()) {
    options.cu_seqlens_q = &cu_q;
    options.cu_seqlens_k = &cu_k;
  }
  CallArgs args;
  args.pass = pass;
  args.q = &q;
  args.k = &k;
  args.v = &v;
  args.out = &out;
  args.lse = &lse;
  args.options = &options;
  if (pass == Pass::backward) {
    args.dout = &dout;
    args.dq = &dq;
    args.dk = &dk;
    args.dv = &dv;
  }
  Params params;
  const Status status = build_params(args, &params);
  if (!status.is_ok()) fail("describing the host copies failed: ", status.message);
  return params;
}

Params Problem::host_params_into(Pass pass, HostOutputs& outputs) const {
  Params params = host_params(pass);
  outputs.out.assign(out_.bytes(), std::byte{0});
  params.out.data = outputs.out.data();
  if (pass == Pass::backward) {
    outputs.dq.assign(dq_.bytes(), std::byte{0});
    outputs.dk.assign(dk_.bytes(), std::byte{0});
    outputs.dv.assign(dv_.bytes(), std::byte{0});
    params.dq.data = outputs.dq.data();
    params.dk.data = outputs.dk.data();
    params.dv.data = outputs.dv.data();
  }
  return params;
}

}  // namespace flashattn::cli
