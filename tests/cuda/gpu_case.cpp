#include "cuda/gpu_case.h"

#include <cuda_runtime.h>

#include <set>
#include <stdexcept>
#include <string>

namespace flashattn::test {

GpuCase::GpuCase(const Case& c) : host(c) {
  q_ = mirror(host.q);
  k_ = mirror(host.k);
  v_ = mirror(host.v);
  out_ = mirror(host.out);
  lse_ = mirror(host.lse);
  dout_ = mirror(host.dout);
  dq_ = mirror(host.dq);
  dk_ = mirror(host.dk);
  dv_ = mirror(host.dv);
  options_ = host.options;
  if (host.options.alibi_slopes) {
    alibi_ = mirror(host.alibi_slopes);
    options_.alibi_slopes = &alibi_.view;
  }
  if (host.options.cu_seqlens_q) {
    cu_q_ = mirror(host.cu_seqlens_q);
    cu_k_ = mirror(host.cu_seqlens_k);
    options_.cu_seqlens_q = &cu_q_.view;
    options_.cu_seqlens_k = &cu_k_.view;
  }
  options_.backend = FLASHATTN_BACKEND_CUDA;
}

GpuCase::Mirror GpuCase::mirror(HostTensor& t) {
  Mirror m;
  m.host = &t;
  m.device = std::make_unique<DeviceBuffer<uint8_t>>(t.storage_bytes());
  upload(m);
  m.view = t.view_on(m.device->get(), FLASHATTN_DEVICE_CUDA, 0);
  return m;
}

void GpuCase::upload(Mirror& m) {
  cuda_check(cudaMemcpy(m.device->get(), m.host->data(), m.host->storage_bytes(), cudaMemcpyHostToDevice), "upload");
}

void GpuCase::poison_forward_outputs() {
  host.poison_forward_outputs();
  upload(out_);
  upload(lse_);
}

void GpuCase::poison_gradients() {
  host.poison_gradients();
  upload(dq_);
  upload(dk_);
  upload(dv_);
}

void GpuCase::upload_inputs() {
  for (Mirror* m : {&q_, &k_, &v_, &dout_}) upload(*m);
}

void GpuCase::download(Mirror& m) {
  cuda_check(cudaMemcpy(m.host->data(), m.device->get(), m.host->storage_bytes(), cudaMemcpyDeviceToHost),
             "download");
}

flashattn_status GpuCase::supported(Pass pass, std::string* message) const {
  const flashattn_status s =
      flashattn_supports(pass == Pass::forward ? FLASHATTN_PASS_FORWARD : FLASHATTN_PASS_BACKWARD, &q_.view, &k_.view,
                         &v_.view, &options_);
  *message = flashattn_last_error();
  return s;
}

flashattn_status GpuCase::forward() {
  const flashattn_status s = flashattn_forward(&q_.view, &k_.view, &v_.view, &out_.view, &lse_.view, &options_);
  if (s != FLASHATTN_SUCCESS) return s;
  cuda_check(cudaDeviceSynchronize(), "forward");
  download(out_);
  download(lse_);
  return s;
}

flashattn_status GpuCase::backward() {
  const flashattn_status s = flashattn_backward(&dout_.view, &q_.view, &k_.view, &v_.view, &out_.view, &lse_.view,
                                                &dq_.view, &dk_.view, &dv_.view, &options_);
  if (s != FLASHATTN_SUCCESS) return s;
  cuda_check(cudaDeviceSynchronize(), "backward");
  download(dq_);
  download(dk_);
  download(dv_);
  return s;
}

// The feature cases named in `features` again at head dim `head_dim`, named <case>_head_dim_<d>.
// A renamed feature would drop its case without a word: every name must find its case.
static void append_features_at(std::vector<NamedCase>& cases, flashattn_dtype dtype,
                               const std::set<std::string>& features, int head_dim) {
  size_t found = 0;
  for (NamedCase& c : feature_sweep(dtype, {head_dim}))
    if (features.count(c.name)) {
      cases.push_back({c.name + "_head_dim_" + std::to_string(head_dim), std::move(c.spec)});
      ++found;
    }
  if (found != features.size())
    throw std::logic_error("cuda_sweep: a d = " + std::to_string(head_dim) + " feature names no case of feature_sweep");
}

std::vector<NamedCase> cuda_sweep(flashattn_dtype dtype) {
  // 64 first (the default of the feature cases); 40 and 72 round up to 64 and 96.
  const std::vector<int> head_dims{64, 40, 72, 96, 128, 192, 256};
  std::vector<NamedCase> cases = feature_sweep(dtype, head_dims);
  // The sm_90a backward at d = 256 is a kernel of its own (80-key blocks, products turned), and
  // the d = 256 forward writes O from its registers: the features whose blocks they walk, mask or
  // store on paths of their own, again at d = 256 (the many-tile cases: the persistent forward's
  // tile loop, with tiles without keys and partial varlen tiles).
  const std::set<std::string> wide_features{"square_17",
                                            "long_1000_causal",
                                            "long_1000_window",
                                            "queries_1000_keys_17_causal",
                                            "causal_more_queries",
                                            "window_both",
                                            "gqa_4_to_1",
                                            "mqa_causal",
                                            "varlen_with_empty_sequences",
                                            "softcap_causal",
                                            "alibi_per_batch_and_head",
                                            "bhsd_padded_gqa_causal",
                                            "many_tiles_causal_gqa",
                                            "many_tiles_keyless_rows",
                                            "varlen_many_tiles_causal"};
  append_features_at(cases, dtype, wide_features, 256);
  // The sm_90a forward takes tall tiles at d = 128 as well (sm90::forward_tall: from 129 query
  // rows where they compute few more rows than 128-row tiles), 192 rows with the lazy rescale,
  // which the d = 64 tall tiles (256 rows) do not have: the features of more than 128 query rows
  // again at d = 128.
  const std::set<std::string> tall_features{"more_queries_than_keys", "causal_more_queries", "window_right",
                                            "window_both",            "varlen_window_bhsd",  "many_tiles_causal_gqa",
                                            "many_tiles_keyless_rows", "softcap_alibi_tall_rows"};
  append_features_at(cases, dtype, tall_features, 128);
  for (NamedCase& c : random_sweep(dtype, head_dims, 16, 11 + uint64_t(dtype))) cases.push_back(std::move(c));
  for (NamedCase& c : cases) {
    c.spec.backend = FLASHATTN_BACKEND_CUDA;
    if (c.spec.row_pad) c.spec.row_pad = 8;  // padded rows, still 16-byte aligned
  }
  return cases;
}

}  // namespace flashattn::test
