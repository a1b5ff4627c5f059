#include "core/validate.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace flashattn {
namespace {

constexpr int kMaxHeadDim = 256;

const char* device_name(flashattn_device d) { return d == FLASHATTN_DEVICE_CUDA ? "cuda" : "cpu"; }

std::string dtype_label(flashattn_dtype t) {
  switch (t) {
    case FLASHATTN_DTYPE_FLOAT32:
    case FLASHATTN_DTYPE_FLOAT16:
    case FLASHATTN_DTYPE_BFLOAT16: return dtype_name(DType(t));
    case FLASHATTN_DTYPE_INT32: return "int32";
  }
  return "unknown(" + std::to_string(int(t)) + ")";
}

std::string shape_label(const flashattn_tensor& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank && i < FLASHATTN_MAX_RANK; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

int64_t numel(const flashattn_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.rank; ++i) n *= t.shape[i];
  return n;
}

// A tensor named `name`: rank, non-negative sizes, contiguous last dimension, non-negative
// strides, dtype; data only when the call will touch it.
Status check_tensor(const flashattn_tensor* t, const char* name, int rank, bool shapes_only) {
  if (!t) return invalid(name, " is NULL");
  if (t->rank != rank)
    return invalid(name, ".rank=", t->rank, " must be ", rank);
  for (int i = 0; i < rank; ++i) {
    if (t->shape[i] < 0) return invalid(name, ".shape[", i, "]=", t->shape[i], " must be >= 0");
    if (t->strides[i] < 0) return invalid(name, ".strides[", i, "]=", t->strides[i], " must be >= 0");
  }
  if (t->shape[rank - 1] > 1 && t->strides[rank - 1] != 1)
    return invalid(name, ".strides[", rank - 1, "]=", t->strides[rank - 1],
                   " must be 1 (the last dimension must be contiguous)");
  if (t->device != FLASHATTN_DEVICE_CPU && t->device != FLASHATTN_DEVICE_CUDA)
    return invalid(name, ".device=", int(t->device), " is not a known device");
  if (t->dtype < FLASHATTN_DTYPE_FLOAT32 || t->dtype > FLASHATTN_DTYPE_INT32)
    return invalid(name, ".dtype=", int(t->dtype), " is not a known dtype");
  if (!shapes_only && t->data == nullptr && numel(*t) > 0) return invalid(name, ".data is NULL");
  if (t->data) {
    const size_t align = t->dtype == FLASHATTN_DTYPE_FLOAT32 || t->dtype == FLASHATTN_DTYPE_INT32 ? 4 : 2;
    if (reinterpret_cast<uintptr_t>(t->data) % align != 0)
      return invalid(name, ".data=", t->data, " is not aligned to its ", align, "-byte elements");
  }
  return Status::ok();
}

// Outputs must not overlap themselves: sorted by stride, each stride must step over everything
// the smaller ones span, or two threads would write one element.
Status check_no_self_overlap(const flashattn_tensor& t, const char* name) {
  if (numel(t) == 0) return Status::ok();  // nothing to write: strides are free
  std::array<int, FLASHATTN_MAX_RANK> order{};
  int n = 0;
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] > 1) order[n++] = i;
  for (int x = 1; x < n; ++x)  // insertion sort by stride: at most 4 dimensions
    for (int y = x; y > 0 && t.strides[order[y]] < t.strides[order[y - 1]]; --y) std::swap(order[y], order[y - 1]);
  int64_t span = 1;  // elements covered by the dimensions so far
  for (int x = 0; x < n; ++x) {
    const int i = order[x];
    if (t.strides[i] < span)
      return invalid(name, ".strides[", i, "]=", t.strides[i], " makes elements of ", name,
                     " overlap (an output needs at least ", span, ")");
    span = t.strides[i] * (t.shape[i] - 1) + span;
  }
  return Status::ok();
}

Status expect_shape(const flashattn_tensor& t, const char* name, std::initializer_list<int64_t> want) {
  int i = 0;
  bool same = int(want.size()) == t.rank;
  for (int64_t w : want) same = same && t.shape[i++] == w;
  if (same) return Status::ok();
  std::string expected = "[";
  i = 0;
  for (int64_t w : want) expected += (i++ ? ", " : "") + std::to_string(w);
  return invalid(name, ".shape=", shape_label(t), " must be ", expected, "]");
}

Status same_dtype(const flashattn_tensor& t, const char* name, const flashattn_tensor& q) {
  if (t.dtype != q.dtype)
    return invalid(name, ".dtype=", dtype_label(t.dtype), " must match q.dtype=", dtype_label(q.dtype));
  return Status::ok();
}

Status same_device(const flashattn_tensor& t, const char* name, const flashattn_tensor& q) {
  if (t.device != q.device || (t.device == FLASHATTN_DEVICE_CUDA && t.device_index != q.device_index))
    return invalid(name, " is on ", device_name(t.device), ":", t.device_index, " but q is on ",
                   device_name(q.device), ":", q.device_index);
  return Status::ok();
}

Operand operand_of(const flashattn_tensor* t, bool varlen) {
  Operand o;
  if (!t) return o;
  o.data = t->data;
  if (varlen) {
    o.row = t->strides[0];
    o.head = t->strides[1];
  } else {
    o.batch = t->strides[0];
    o.row = t->strides[1];
    o.head = t->strides[2];
  }
  return o;
}

Status check_options(const flashattn_options* o) {
  if (!o) return invalid("options is NULL");
  if (o->struct_size < sizeof(flashattn_options))
    return invalid("options.struct_size=", o->struct_size, " is smaller than sizeof(flashattn_options)=",
                   sizeof(flashattn_options), "; initialise with flashattn_options_init()");
  if (!std::isfinite(o->softmax_scale)) return invalid("options.softmax_scale=", o->softmax_scale, " must be finite");
  if (o->causal != 0 && o->causal != 1) return invalid("options.causal=", o->causal, " must be 0 or 1");
  if (o->window_left < -1) return invalid("options.window_left=", o->window_left, " must be >= -1 (-1: unbounded)");
  if (o->window_right < -1)
    return invalid("options.window_right=", o->window_right, " must be >= -1 (-1: unbounded)");
  if (o->causal && o->window_right > 0)
    return invalid("options.window_right=", o->window_right, " contradicts options.causal=1 (causal means window_right=0)");
  if (!std::isfinite(o->softcap) || o->softcap < 0)
    return invalid("options.softcap=", o->softcap, " must be finite and >= 0");
  if (!(o->dropout_p >= 0.f && o->dropout_p < 1.f))
    return invalid("options.dropout_p=", o->dropout_p, " must be in [0, 1)");
  if (o->backend < FLASHATTN_BACKEND_AUTO || o->backend > FLASHATTN_BACKEND_CUDA)
    return invalid("options.backend=", int(o->backend), " is not a known backend");
  if (o->deterministic != 0 && o->deterministic != 1)
    return invalid("options.deterministic=", o->deterministic, " must be 0 or 1");
  if (o->num_threads < 0) return invalid("options.num_threads=", o->num_threads, " must be >= 0");
  if (o->workspace && o->workspace_size == 0)
    return invalid("options.workspace is set but options.workspace_size=0");
  if ((o->cu_seqlens_q == nullptr) != (o->cu_seqlens_k == nullptr))
    return invalid(o->cu_seqlens_q ? "options.cu_seqlens_k" : "options.cu_seqlens_q",
                   " is NULL but the other cu_seqlens is set; give both for a variable-length batch");
  return Status::ok();
}

// cu_seqlens: int32 [batch + 1], starting at 0, non-decreasing, ending within `rows` rows,
// no sequence longer than `max_seqlen`. Contents are checked where the host can read them.
Status check_cu_seqlens(const flashattn_tensor* t, const char* name, const flashattn_tensor& q, int64_t rows,
                        int32_t max_seqlen, const char* max_name, bool shapes_only) {
  FA_TRY(check_tensor(t, name, 1, shapes_only));
  if (t->dtype != FLASHATTN_DTYPE_INT32) return invalid(name, ".dtype=", dtype_label(t->dtype), " must be int32");
  if (t->shape[0] < 1) return invalid(name, ".shape[0]=", t->shape[0], " must be >= 1 (batch + 1)");
  FA_TRY(same_device(*t, name, q));
  if (max_seqlen < 0) return invalid("options.", max_name, "=", max_seqlen, " must be >= 0");
  if (shapes_only || t->device != FLASHATTN_DEVICE_CPU || !t->data) return Status::ok();
  const auto* cu = static_cast<const int32_t*>(t->data);
  if (cu[0] != 0) return invalid(name, "[0]=", cu[0], " must be 0");
  for (int64_t b = 0; b + 1 < t->shape[0]; ++b) {
    const int64_t len = int64_t(cu[b + 1]) - cu[b];
    if (len < 0)
      return invalid(name, " must be non-decreasing, but ", name, "[", b + 1, "]=", cu[b + 1], " < ", name, "[", b,
                     "]=", cu[b]);
    if (len > max_seqlen)
      return invalid(name, " gives sequence ", b, " length ", len, " > options.", max_name, "=", max_seqlen);
  }
  const int32_t last = cu[t->shape[0] - 1];
  if (last > rows) return invalid(name, "[", t->shape[0] - 1, "]=", last, " exceeds the ", rows, " rows of the tensor");
  return Status::ok();
}

Status check_alibi(const flashattn_tensor* t, const flashattn_tensor& q, int batch, int heads_q, bool shapes_only,
                   Params* p) {
  const char* name = "options.alibi_slopes";
  if (!t) return Status::ok();
  if (t->rank != 1 && t->rank != 2) return invalid(name, ".rank=", t->rank, " must be 1 ([heads_q]) or 2 ([batch, heads_q])");
  FA_TRY(check_tensor(t, name, t->rank, shapes_only));
  if (t->dtype != FLASHATTN_DTYPE_FLOAT32) return invalid(name, ".dtype=", dtype_label(t->dtype), " must be float32");
  FA_TRY(same_device(*t, name, q));
  if (t->rank == 1) FA_TRY(expect_shape(*t, name, {heads_q}));
  else FA_TRY(expect_shape(*t, name, {batch, heads_q}));
  p->alibi_slopes = static_cast<const float*>(t->data);
  p->alibi_batch = t->rank == 2 ? t->strides[0] : 0;
  p->alibi = true;
  return Status::ok();
}

}  // namespace

Status build_params(const CallArgs& a, Params* out_params) {
  Params p;
  p.pass = a.pass;
  const bool backward = a.pass == Pass::backward;
  FA_TRY(check_options(a.options));
  const flashattn_options& o = *a.options;
  const bool varlen = o.cu_seqlens_q != nullptr;
  const int rank = varlen ? 3 : 4;
  const int seq = varlen ? 0 : 1;  // index of the sequence dimension (rows for varlen)
  const int hd = rank - 2, dd = rank - 1;
  const bool so = a.shapes_only;

  FA_TRY(check_tensor(a.q, "q", rank, so));
  FA_TRY(check_tensor(a.k, "k", rank, so));
  FA_TRY(check_tensor(a.v, "v", rank, so));
  const flashattn_tensor &q = *a.q, &k = *a.k, &v = *a.v;
  if (q.dtype != FLASHATTN_DTYPE_FLOAT32 && q.dtype != FLASHATTN_DTYPE_FLOAT16 && q.dtype != FLASHATTN_DTYPE_BFLOAT16)
    return invalid("q.dtype=", dtype_label(q.dtype), " must be float32, float16 or bfloat16");
  FA_TRY(same_dtype(k, "k", q));
  FA_TRY(same_dtype(v, "v", q));
  FA_TRY(same_device(k, "k", q));
  FA_TRY(same_device(v, "v", q));

  const int64_t heads_q = q.shape[hd], heads_kv = k.shape[hd], d = q.shape[dd], d_v = v.shape[dd];
  if (heads_q < 1) return invalid("q.shape[", hd, "]=", heads_q, " (heads) must be >= 1");
  if (heads_kv < 1) return invalid("k.shape[", hd, "]=", heads_kv, " (heads) must be >= 1");
  if (heads_q % heads_kv != 0)
    return invalid("k.shape[", hd, "]=", heads_kv, " must divide q.shape[", hd, "]=", heads_q,
                   " (query heads are grouped over key/value heads)");
  if (d < 1) return invalid("q.shape[", dd, "]=", d, " (head dim) must be >= 1");
  if (k.shape[dd] != d) return invalid("k.shape[", dd, "]=", k.shape[dd], " must equal q.shape[", dd, "]=", d);
  if (d_v < 1) return invalid("v.shape[", dd, "]=", d_v, " (head dim) must be >= 1");
  if (d > kMaxHeadDim) return unsupported("q.shape[", dd, "]=", d, ": head dims above ", kMaxHeadDim, " are not supported");
  if (d_v > kMaxHeadDim)
    return unsupported("v.shape[", dd, "]=", d_v, ": head dims above ", kMaxHeadDim, " are not supported");
  if (v.shape[seq] != k.shape[seq])
    return invalid("v.shape[", seq, "]=", v.shape[seq], " must equal k.shape[", seq, "]=", k.shape[seq]);
  if (v.shape[hd] != heads_kv)
    return invalid("v.shape[", hd, "]=", v.shape[hd], " must equal k.shape[", hd, "]=", heads_kv);

  int64_t batch, seqlen_q, seqlen_k;
  if (varlen) {
    FA_TRY(check_cu_seqlens(o.cu_seqlens_q, "options.cu_seqlens_q", q, q.shape[0], o.max_seqlen_q, "max_seqlen_q", so));
    FA_TRY(check_cu_seqlens(o.cu_seqlens_k, "options.cu_seqlens_k", q, k.shape[0], o.max_seqlen_k, "max_seqlen_k", so));
    batch = o.cu_seqlens_q->shape[0] - 1;
    if (o.cu_seqlens_k->shape[0] != batch + 1)
      return invalid("options.cu_seqlens_k.shape[0]=", o.cu_seqlens_k->shape[0],
                     " must equal options.cu_seqlens_q.shape[0]=", batch + 1);
    seqlen_q = o.max_seqlen_q;
    seqlen_k = o.max_seqlen_k;
    p.cu_seqlens_q = static_cast<const int32_t*>(o.cu_seqlens_q->data);
    p.cu_seqlens_k = static_cast<const int32_t*>(o.cu_seqlens_k->data);
    p.variable_length = true;
    p.total_q = q.shape[0];
    p.total_k = k.shape[0];
  } else {
    batch = q.shape[0];
    seqlen_q = q.shape[1];
    seqlen_k = k.shape[1];
    if (k.shape[0] != batch) return invalid("k.shape[0]=", k.shape[0], " must equal q.shape[0]=", batch);
    if (v.shape[0] != batch) return invalid("v.shape[0]=", v.shape[0], " must equal q.shape[0]=", batch);
  }
  if (seqlen_q > INT32_MAX || seqlen_k > INT32_MAX || batch > INT32_MAX)
    return unsupported("sequence lengths and batch must fit in int32, got seqlen_q=", seqlen_q, " seqlen_k=", seqlen_k,
                       " batch=", batch);

  p.dtype = DType(q.dtype);
  p.batch = int(batch);
  p.heads_q = int(heads_q);
  p.heads_kv = int(heads_kv);
  p.head_dim = int(d);
  p.head_dim_v = int(d_v);
  p.seqlen_q = int(seqlen_q);
  p.seqlen_k = int(seqlen_k);
  p.q = operand_of(a.q, varlen);
  p.k = operand_of(a.k, varlen);
  p.v = operand_of(a.v, varlen);
  p.device = q.device;
  p.device_index = q.device_index;

  // out [.., seqlen_q, heads_q, d_v] and lse; in a forward call they are written.
  auto check_like_q = [&](const flashattn_tensor* t, const char* name, int64_t last, bool written) -> Status {
    FA_TRY(check_tensor(t, name, rank, so));
    FA_TRY(same_dtype(*t, name, q));
    FA_TRY(same_device(*t, name, q));
    if (varlen) FA_TRY(expect_shape(*t, name, {q.shape[0], heads_q, last}));
    else FA_TRY(expect_shape(*t, name, {batch, seqlen_q, heads_q, last}));
    if (written) FA_TRY(check_no_self_overlap(*t, name));
    return Status::ok();
  };
  const bool need_out = !so || a.out;
  if (need_out) {
    if (!a.out) return invalid("out is NULL");
    FA_TRY(check_like_q(a.out, "out", d_v, !backward));
    p.out = operand_of(a.out, varlen);
  }
  if (a.lse) {
    FA_TRY(check_tensor(a.lse, "lse", varlen ? 2 : 3, so));
    if (a.lse->dtype != FLASHATTN_DTYPE_FLOAT32)
      return invalid("lse.dtype=", dtype_label(a.lse->dtype), " must be float32");
    FA_TRY(same_device(*a.lse, "lse", q));
    if (varlen) FA_TRY(expect_shape(*a.lse, "lse", {heads_q, q.shape[0]}));
    else FA_TRY(expect_shape(*a.lse, "lse", {batch, heads_q, seqlen_q}));
    if (!backward) FA_TRY(check_no_self_overlap(*a.lse, "lse"));
    p.lse = static_cast<float*>(a.lse->data);
    p.lse_batch = varlen ? 0 : a.lse->strides[0];
    p.lse_head = varlen ? a.lse->strides[0] : a.lse->strides[1];
  } else if (backward && !so) {
    return invalid("lse is NULL; the backward pass needs the forward's log-sum-exp");
  }

  if (backward) {
    if (!so || a.dout) {
      FA_TRY(check_like_q(a.dout, "dout", d_v, false));
      FA_TRY(check_like_q(a.dq, "dq", d, true));
      FA_TRY(check_tensor(a.dk, "dk", rank, so));
      FA_TRY(check_tensor(a.dv, "dv", rank, so));
      FA_TRY(same_dtype(*a.dk, "dk", q));
      FA_TRY(same_dtype(*a.dv, "dv", q));
      FA_TRY(same_device(*a.dk, "dk", q));
      FA_TRY(same_device(*a.dv, "dv", q));
      if (varlen) {
        FA_TRY(expect_shape(*a.dk, "dk", {k.shape[0], heads_kv, d}));
        FA_TRY(expect_shape(*a.dv, "dv", {k.shape[0], heads_kv, d_v}));
      } else {
        FA_TRY(expect_shape(*a.dk, "dk", {batch, seqlen_k, heads_kv, d}));
        FA_TRY(expect_shape(*a.dv, "dv", {batch, seqlen_k, heads_kv, d_v}));
      }
      FA_TRY(check_no_self_overlap(*a.dk, "dk"));
      FA_TRY(check_no_self_overlap(*a.dv, "dv"));
      p.dout = operand_of(a.dout, varlen);
      p.dq = operand_of(a.dq, varlen);
      p.dk = operand_of(a.dk, varlen);
      p.dv = operand_of(a.dv, varlen);
    }
  }

  FA_TRY(check_alibi(o.alibi_slopes, q, p.batch, p.heads_q, so, &p));
  if (o.dropout_p > 0 && int64_t(batch) * heads_q > UINT32_MAX)
    return unsupported("dropout needs batch * heads_q < 2^32, got ", batch, " * ", heads_q);

  p.scale = o.softmax_scale != 0.f ? o.softmax_scale : float(1.0 / std::sqrt(double(d)));
  p.softcap = o.softcap;
  p.window_left = o.window_left;
  p.window_right = o.causal ? 0 : o.window_right;
  p.dropout_p = o.dropout_p;
  p.dropout_seed = o.dropout_seed;
  p.dropout_offset = o.dropout_offset;
  p.deterministic = o.deterministic != 0;
  p.num_threads = o.num_threads;
  p.stream = o.cuda_stream;
  p.workspace = o.workspace;
  p.workspace_size = o.workspace_size;
  *out_params = p;
  return Status::ok();
}

Status select_backend(const Params& p, flashattn_backend requested, const BackendOps** chosen) {
  const BackendOps* ops = nullptr;
  const bool on_cuda = p.device == FLASHATTN_DEVICE_CUDA;
  if (requested == FLASHATTN_BACKEND_CPU) {
    if (on_cuda) return invalid("options.backend=cpu but the tensors are on cuda:", p.device_index);
    ops = &cpu_backend();
  } else if (requested == FLASHATTN_BACKEND_CUDA || on_cuda) {
    if (!on_cuda) return invalid("options.backend=cuda but the tensors are on the cpu");
#if defined(FLASHATTN_WITH_CUDA)
    ops = &cuda_backend();
#else
    return make_status(FLASHATTN_ERROR_BACKEND_UNAVAILABLE,
                       "options.backend=cuda (or tensors on cuda): flashattn was built without CUDA");
#endif
  } else {
    ops = &cpu_backend();
  }
  if (!ops->available())
    return make_status(FLASHATTN_ERROR_BACKEND_UNAVAILABLE, "backend ", ops->name, " is not available on this machine");
  FA_TRY(ops->supports(p));
  *chosen = ops;
  return Status::ok();
}

}  // namespace flashattn
