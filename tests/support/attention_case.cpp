#include "support/attention_case.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "core/dtype.h"
#include "core/validate.h"

namespace flashattn::test {
namespace {

int max_of(const std::vector<int>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

std::vector<int32_t> prefix_sums(const std::vector<int>& lengths) {
  std::vector<int32_t> cu(lengths.size() + 1, 0);
  for (size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + lengths[b];
  return cu;
}

// The geometric ALiBi slopes of the paper, 2^(-8 (h + 1) / heads), scaled per batch entry so that
// per-batch slopes differ from per-head ones.
std::vector<float> alibi_values(const Case& c) {
  const int rows = c.alibi == Alibi::per_batch_head ? c.batch_size() : 1;
  std::vector<float> slopes;
  for (int b = 0; b < rows; ++b)
    for (int h = 0; h < c.heads_q; ++h)
      slopes.push_back(float(std::exp2(-8.0 * (h + 1) / c.heads_q) * (1.0 + 0.5 * b)));
  return slopes;
}

HostTensor make_sequences(const Case& c, int64_t seq, int64_t total, int heads, int dim) {
  if (c.varlen()) return HostTensor::packed_sequences(c.dtype, c.layout, total, heads, dim, c.row_pad);
  return HostTensor::sequences(c.dtype, c.layout, c.batch, seq, heads, dim, c.row_pad);
}

}  // namespace

int Case::max_seqlen_q() const { return varlen() ? max_of(seqlens_q) : seqlen_q; }
int Case::max_seqlen_k() const { return varlen() ? max_of(seqlens_k) : seqlen_k; }
int64_t Case::rows_q() const {
  return varlen() ? std::accumulate(seqlens_q.begin(), seqlens_q.end(), int64_t(0)) : int64_t(batch) * seqlen_q;
}
int64_t Case::rows_k() const {
  return varlen() ? std::accumulate(seqlens_k.begin(), seqlens_k.end(), int64_t(0)) : int64_t(batch) * seqlen_k;
}

std::string Case::describe() const {
  std::ostringstream s;
  s << dtype_name(DType(dtype)) << " " << layout_name(layout);
  if (varlen()) {
    s << " varlen q=[";
    for (size_t b = 0; b < seqlens_q.size(); ++b) s << (b ? "," : "") << seqlens_q[b];
    s << "] k=[";
    for (size_t b = 0; b < seqlens_k.size(); ++b) s << (b ? "," : "") << seqlens_k[b];
    s << "]";
  } else {
    s << " B=" << batch << " Sq=" << seqlen_q << " Sk=" << seqlen_k;
  }
  s << " H=" << heads_q << "/" << heads_kv << " d=" << head_dim << " dv=" << value_dim();
  if (row_pad) s << " pad=" << row_pad;
  if (causal) s << " causal";
  if (window_left >= 0 || window_right >= 0) s << " window=(" << window_left << "," << window_right << ")";
  if (softcap > 0) s << " softcap=" << softcap;
  if (alibi != Alibi::none) s << (alibi == Alibi::per_head ? " alibi[H]" : " alibi[B,H]");
  if (dropout_p > 0) s << " dropout=" << dropout_p << " seed=" << dropout_seed << " offset=" << dropout_offset;
  if (softmax_scale != 0) s << " scale=" << softmax_scale;
  if (num_threads) s << " threads=" << num_threads;
  return s.str();
}

CaseData::CaseData(const Case& c)
    : spec(c),
      q(make_sequences(c, c.seqlen_q, c.rows_q(), c.heads_q, c.head_dim)),
      k(make_sequences(c, c.seqlen_k, c.rows_k(), c.heads_kv, c.head_dim)),
      v(make_sequences(c, c.seqlen_k, c.rows_k(), c.heads_kv, c.value_dim())),
      out(make_sequences(c, c.seqlen_q, c.rows_q(), c.heads_q, c.value_dim())),
      lse(c.varlen() ? HostTensor::lse_packed(c.heads_q, c.rows_q(), c.row_pad)
                     : HostTensor::lse(c.batch, c.heads_q, c.seqlen_q, c.row_pad)),
      dout(make_sequences(c, c.seqlen_q, c.rows_q(), c.heads_q, c.value_dim())),
      dq(make_sequences(c, c.seqlen_q, c.rows_q(), c.heads_q, c.head_dim)),
      dk(make_sequences(c, c.seqlen_k, c.rows_k(), c.heads_kv, c.head_dim)),
      dv(make_sequences(c, c.seqlen_k, c.rows_k(), c.heads_kv, c.value_dim())) {
  q.fill_normal(c.data_seed * 4 + 0, c.input_stddev);
  k.fill_normal(c.data_seed * 4 + 1, c.input_stddev);
  v.fill_normal(c.data_seed * 4 + 2, c.input_stddev);
  dout.fill_normal(c.data_seed * 4 + 3, c.input_stddev);

  flashattn_options_init(&options);
  options.softmax_scale = c.softmax_scale;
  options.causal = c.causal;
  options.window_left = c.window_left;
  options.window_right = c.window_right;
  options.softcap = c.softcap;
  options.dropout_p = c.dropout_p;
  options.dropout_seed = c.dropout_seed;
  options.dropout_offset = c.dropout_offset;
  options.num_threads = c.num_threads;
  options.backend = c.backend;
  if (c.alibi != Alibi::none) {
    const std::vector<float> slopes = alibi_values(c);
    alibi_slopes = c.alibi == Alibi::per_head ? HostTensor::float32(slopes, {c.heads_q})
                                              : HostTensor::float32(slopes, {c.batch_size(), c.heads_q});
    options.alibi_slopes = alibi_slopes.desc();
  }
  if (c.varlen()) {
    if (c.seqlens_k.size() != c.seqlens_q.size()) throw std::invalid_argument("Case: seqlens_q and seqlens_k differ in size");
    cu_seqlens_q = HostTensor::int32(prefix_sums(c.seqlens_q));
    cu_seqlens_k = HostTensor::int32(prefix_sums(c.seqlens_k));
    options.cu_seqlens_q = cu_seqlens_q.desc();
    options.cu_seqlens_k = cu_seqlens_k.desc();
    options.max_seqlen_q = c.max_seqlen_q();
    options.max_seqlen_k = c.max_seqlen_k();
  }
}

void CaseData::poison_forward_outputs() {
  out.poison();
  lse.poison();
}

void CaseData::poison_gradients() {
  dq.poison();
  dk.poison();
  dv.poison();
}

flashattn_status CaseData::forward() { return flashattn_forward(q.desc(), k.desc(), v.desc(), out.desc(), lse.desc(), &options); }

flashattn_status CaseData::backward() {
  return flashattn_backward(dout.desc(), q.desc(), k.desc(), v.desc(), out.desc(), lse.desc(), dq.desc(), dk.desc(),
                            dv.desc(), &options);
}

Params CaseData::params(Pass pass) const {
  CallArgs a;
  a.pass = pass;
  a.q = q.desc();
  a.k = k.desc();
  a.v = v.desc();
  a.out = out.desc();
  a.lse = lse.desc();
  a.options = &options;
  if (pass == Pass::backward) {
    a.dout = dout.desc();
    a.dq = dq.desc();
    a.dk = dk.desc();
    a.dv = dv.desc();
  }
  Params p;
  const Status s = build_params(a, &p);
  if (!s.is_ok()) throw std::invalid_argument("CaseData::params: " + s.message + " (" + spec.describe() + ")");
  return p;
}

}  // namespace flashattn::test
