// One test per invalid input: the call returns the right status, flashattn_last_error() names the
// argument and its value, and every output byte (poisoned before the call) is left untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/attention_case.h"

using namespace flashattn;
using namespace flashattn::test;

namespace {

// The arguments of one call, copied from a valid case so that a test can break any of them.
struct Call {
  Pass pass = Pass::forward;
  flashattn_tensor q, k, v, out, lse, dout, dq, dk, dv;
  const flashattn_tensor *pq = &q, *pk = &k, *pv = &v, *pdout = &dout;
  flashattn_tensor *pout = &out, *plse = &lse, *pdq = &dq, *pdk = &dk, *pdv = &dv;
  flashattn_options options;
  const flashattn_options* poptions = &options;

  Call(CaseData& d, Pass p)
      : pass(p), q(*d.q.desc()), k(*d.k.desc()), v(*d.v.desc()), out(*d.out.desc()), lse(*d.lse.desc()),
        dout(*d.dout.desc()), dq(*d.dq.desc()), dk(*d.dk.desc()), dv(*d.dv.desc()), options(d.options) {}
  Call(const Call&) = delete;

  flashattn_status run() const {
    if (pass == Pass::forward) return flashattn_forward(pq, pk, pv, pout, plse, poptions);
    return flashattn_backward(pdout, pq, pk, pv, pout, plse, pdq, pdk, pdv, poptions);
  }
};

struct InvalidInput {
  std::string name;
  std::function<void(Call&, CaseData&)> corrupt;
  flashattn_status status = FLASHATTN_ERROR_INVALID_ARGUMENT;
  std::vector<std::string> message;  // every part must appear in flashattn_last_error()
  Pass pass = Pass::forward;
  bool varlen = false;
};

void PrintTo(const InvalidInput& c, std::ostream* os) { *os << c.name; }

Case valid_case(bool varlen) {
  Case c;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 8;
  c.alibi = Alibi::per_head;
  if (varlen) {
    c.seqlens_q = {3, 2};
    c.seqlens_k = {4, 5};
  } else {
    c.batch = 2;
    c.seqlen_q = 5;
    c.seqlen_k = 7;
  }
  return c;
}

// Marks every tensor of the call as CUDA memory (the pointers stay host pointers: validation
// must reject the call before anything dereferences them).
void move_to_cuda(Call& c, CaseData& d) {
  for (flashattn_tensor* t : {&c.q, &c.k, &c.v, &c.out, &c.lse}) t->device = FLASHATTN_DEVICE_CUDA;
  d.alibi_slopes.desc()->device = FLASHATTN_DEVICE_CUDA;
}

using C = Call;
using D = CaseData;

std::vector<InvalidInput> invalid_inputs() {
  const flashattn_status kInvalid = FLASHATTN_ERROR_INVALID_ARGUMENT, kUnsupported = FLASHATTN_ERROR_UNSUPPORTED;
  static std::vector<uint8_t> small_workspace(16);
  return {
      // Shapes.
      {"q_wrong_rank", [](C& c, D&) { c.q.rank = 3; }, kInvalid, {"q.rank=3", "must be 4"}},
      {"q_negative_size", [](C& c, D&) { c.q.shape[1] = -1; }, kInvalid, {"q.shape[1]=-1"}},
      {"k_batch_differs", [](C& c, D&) { c.k.shape[0] = 3; }, kInvalid, {"k.shape[0]=3", "q.shape[0]=2"}},
      {"v_seqlen_differs", [](C& c, D&) { c.v.shape[1] = 6; }, kInvalid, {"v.shape[1]=6", "k.shape[1]=7"}},
      {"v_heads_differ", [](C& c, D&) { c.v.shape[2] = 1; }, kInvalid, {"v.shape[2]=1", "k.shape[2]=2"}},
      {"k_head_dim_differs", [](C& c, D&) { c.k.shape[3] = 4; }, kInvalid, {"k.shape[3]=4", "q.shape[3]=8"}},
      {"heads_not_divisible", [](C& c, D&) { c.k.shape[2] = c.v.shape[2] = 3; }, kInvalid,
       {"k.shape[2]=3", "q.shape[2]=4"}},
      {"zero_heads", [](C& c, D&) { c.q.shape[2] = 0; }, kInvalid, {"q.shape[2]=0"}},
      {"zero_head_dim", [](C& c, D&) { c.q.shape[3] = c.k.shape[3] = 0; }, kInvalid, {"q.shape[3]=0"}},
      {"head_dim_unsupported", [](C& c, D&) { c.q.shape[3] = c.k.shape[3] = 300; }, kUnsupported,
       {"q.shape[3]=300", "256"}},
      {"value_head_dim_unsupported", [](C& c, D&) { c.v.shape[3] = 512; }, kUnsupported, {"v.shape[3]=512"}},
      {"out_wrong_shape", [](C& c, D&) { c.out.shape[3] = 4; }, kInvalid, {"out.shape=[2, 5, 4, 4]", "[2, 5, 4, 8]"}},
      {"lse_wrong_shape", [](C& c, D&) { c.lse.shape[2] = 4; }, kInvalid, {"lse.shape=[2, 4, 4]", "[2, 4, 5]"}},
      {"lse_wrong_rank", [](C& c, D&) { c.lse.rank = 4; }, kInvalid, {"lse.rank=4"}},
      // Pointers.
      {"q_descriptor_null", [](C& c, D&) { c.pq = nullptr; }, kInvalid, {"q is NULL"}},
      {"v_data_null", [](C& c, D&) { c.v.data = nullptr; }, kInvalid, {"v.data is NULL"}},
      {"out_descriptor_null", [](C& c, D&) { c.pout = nullptr; }, kInvalid, {"out is NULL"}},
      {"out_data_null", [](C& c, D&) { c.out.data = nullptr; }, kInvalid, {"out.data is NULL"}},
      {"options_null", [](C& c, D&) { c.poptions = nullptr; }, kInvalid, {"options is NULL"}},
      {"q_misaligned", [](C& c, D&) { c.q.data = static_cast<char*>(c.q.data) + 2; }, kInvalid,
       {"q.data=", "aligned"}},
      // Strides.
      {"q_last_dim_not_contiguous", [](C& c, D&) { c.q.strides[3] = 2; }, kInvalid, {"q.strides[3]=2"}},
      {"k_negative_stride", [](C& c, D&) { c.k.strides[1] = -8; }, kInvalid, {"k.strides[1]=-8"}},
      {"out_rows_overlap", [](C& c, D&) { c.out.strides[1] = 0; }, kInvalid, {"out.strides[1]=0", "overlap"}},
      {"lse_heads_overlap", [](C& c, D&) { c.lse.strides[1] = 2; }, kInvalid, {"lse.strides[1]=2", "overlap"}},
      // Dtypes and devices.
      {"k_dtype_differs", [](C& c, D&) { c.k.dtype = FLASHATTN_DTYPE_FLOAT16; }, kInvalid,
       {"k.dtype=float16", "q.dtype=float32"}},
      {"out_dtype_differs", [](C& c, D&) { c.out.dtype = FLASHATTN_DTYPE_BFLOAT16; }, kInvalid,
       {"out.dtype=bfloat16", "q.dtype=float32"}},
      {"q_int32", [](C& c, D&) { c.q.dtype = c.k.dtype = c.v.dtype = c.out.dtype = FLASHATTN_DTYPE_INT32; }, kInvalid,
       {"q.dtype=int32"}},
      {"q_unknown_dtype", [](C& c, D&) { c.q.dtype = flashattn_dtype(9); }, kInvalid, {"q.dtype=9"}},
      {"lse_float16", [](C& c, D&) { c.lse.dtype = FLASHATTN_DTYPE_FLOAT16; }, kInvalid,
       {"lse.dtype=float16", "float32"}},
      {"k_on_another_device", [](C& c, D&) { c.k.device = FLASHATTN_DEVICE_CUDA; }, kInvalid,
       {"k is on cuda:0", "q is on cpu"}},
      {"q_unknown_device", [](C& c, D&) { c.q.device = flashattn_device(7); }, kInvalid, {"q.device=7"}},
      {"cpu_backend_for_cuda_tensors", [](C& c, D& d) { move_to_cuda(c, d); }, kInvalid,
       {"options.backend=cpu", "cuda:0"}},
      {"cuda_backend_for_host_tensors", [](C& c, D&) { c.options.backend = FLASHATTN_BACKEND_CUDA; }, kInvalid,
       {"options.backend=cuda", "cpu"}},
      // Options.
      {"struct_size_too_small", [](C& c, D&) { c.options.struct_size = 8; }, kInvalid, {"options.struct_size=8"}},
      {"window_left_below_minus_one", [](C& c, D&) { c.options.window_left = -2; }, kInvalid,
       {"options.window_left=-2"}},
      {"window_right_below_minus_one", [](C& c, D&) { c.options.window_right = -5; }, kInvalid,
       {"options.window_right=-5"}},
      {"causal_with_right_window", [](C& c, D&) { c.options.causal = 1, c.options.window_right = 3; }, kInvalid,
       {"options.window_right=3", "causal"}},
      {"causal_not_a_flag", [](C& c, D&) { c.options.causal = 2; }, kInvalid, {"options.causal=2"}},
      {"dropout_one", [](C& c, D&) { c.options.dropout_p = 1.f; }, kInvalid, {"options.dropout_p=1", "[0, 1)"}},
      {"dropout_negative", [](C& c, D&) { c.options.dropout_p = -0.25f; }, kInvalid, {"options.dropout_p=-0.25"}},
      {"dropout_nan", [](C& c, D&) { c.options.dropout_p = std::nanf(""); }, kInvalid, {"options.dropout_p=nan"}},
      {"softcap_negative", [](C& c, D&) { c.options.softcap = -1.f; }, kInvalid, {"options.softcap=-1"}},
      {"scale_infinite", [](C& c, D&) { c.options.softmax_scale = INFINITY; }, kInvalid,
       {"options.softmax_scale=inf"}},
      {"unknown_backend", [](C& c, D&) { c.options.backend = flashattn_backend(9); }, kInvalid,
       {"options.backend=9"}},
      {"deterministic_not_a_flag", [](C& c, D&) { c.options.deterministic = 2; }, kInvalid,
       {"options.deterministic=2"}},
      {"negative_threads", [](C& c, D&) { c.options.num_threads = -1; }, kInvalid, {"options.num_threads=-1"}},
      {"workspace_without_size", [](C& c, D&) { c.options.workspace = small_workspace.data(); }, kInvalid,
       {"options.workspace", "options.workspace_size=0"}},
      {"workspace_too_small",
       [](C& c, D&) {
         c.options.workspace = small_workspace.data();
         c.options.workspace_size = small_workspace.size();
       },
       FLASHATTN_ERROR_WORKSPACE_TOO_SMALL, {"options.workspace_size=16"}},
      // ALiBi slopes.
      {"alibi_wrong_length", [](C&, D& d) { d.alibi_slopes.desc()->shape[0] = 3; }, kInvalid,
       {"options.alibi_slopes.shape=[3]", "[4]"}},
      {"alibi_wrong_batch", [](C&, D& d) {
         flashattn_tensor* t = d.alibi_slopes.desc();
         t->rank = 2, t->shape[0] = 3, t->shape[1] = 4, t->strides[0] = 4, t->strides[1] = 1;
       }, kInvalid, {"options.alibi_slopes.shape=[3, 4]", "[2, 4]"}},
      {"alibi_float16", [](C&, D& d) { d.alibi_slopes.desc()->dtype = FLASHATTN_DTYPE_FLOAT16; }, kInvalid,
       {"options.alibi_slopes.dtype=float16"}},
      {"alibi_rank_3", [](C&, D& d) { d.alibi_slopes.desc()->rank = 3; }, kInvalid, {"options.alibi_slopes.rank=3"}},
      // Variable length.
      {"cu_seqlens_q_alone", [](C& c, D&) { c.options.cu_seqlens_k = nullptr; }, kInvalid,
       {"options.cu_seqlens_k is NULL"}, Pass::forward, true},
      {"cu_seqlens_k_alone", [](C& c, D&) { c.options.cu_seqlens_q = nullptr; }, kInvalid,
       {"options.cu_seqlens_q is NULL"}, Pass::forward, true},
      {"cu_seqlens_decreasing", [](C&, D& d) { d.cu_seqlens_q.set({1}, 2.f), d.cu_seqlens_q.set({2}, 1.f); }, kInvalid,
       {"non-decreasing", "options.cu_seqlens_q[2]=1", "options.cu_seqlens_q[1]=2"}, Pass::forward, true},
      {"cu_seqlens_not_from_zero", [](C&, D& d) { d.cu_seqlens_k.set({0}, 1.f); }, kInvalid,
       {"options.cu_seqlens_k[0]=1"}, Pass::forward, true},
      {"cu_seqlens_past_the_rows", [](C& c, D& d) { d.cu_seqlens_k.set({2}, 10.f), c.options.max_seqlen_k = 10; },
       kInvalid,
       {"options.cu_seqlens_k[2]=10", "9 rows"}, Pass::forward, true},
      {"sequence_longer_than_max", [](C& c, D&) { c.options.max_seqlen_q = 2; }, kInvalid,
       {"options.cu_seqlens_q", "length 3", "options.max_seqlen_q=2"}, Pass::forward, true},
      {"max_seqlen_negative", [](C& c, D&) { c.options.max_seqlen_k = -1; }, kInvalid, {"options.max_seqlen_k=-1"},
       Pass::forward, true},
      {"cu_seqlens_float32", [](C&, D& d) { d.cu_seqlens_q.desc()->dtype = FLASHATTN_DTYPE_FLOAT32; }, kInvalid,
       {"options.cu_seqlens_q.dtype=float32", "int32"}, Pass::forward, true},
      {"cu_seqlens_batches_differ", [](C&, D& d) { d.cu_seqlens_k.desc()->shape[0] = 2; }, kInvalid,
       {"options.cu_seqlens_k.shape[0]=2", "3"}, Pass::forward, true},
      {"varlen_with_dense_rank", [](C& c, D&) { c.q.rank = 4; }, kInvalid, {"q.rank=4", "must be 3"}, Pass::forward,
       true},
      // Backward.
      {"backward_lse_null", [](C& c, D&) { c.plse = nullptr; }, kInvalid, {"lse is NULL"}, Pass::backward},
      {"backward_dout_null", [](C& c, D&) { c.pdout = nullptr; }, kInvalid, {"dout is NULL"}, Pass::backward},
      {"backward_dq_wrong_shape", [](C& c, D&) { c.dq.shape[1] = 4; }, kInvalid, {"dq.shape=[2, 4, 4, 8]"},
       Pass::backward},
      {"backward_dk_dtype_differs", [](C& c, D&) { c.dk.dtype = FLASHATTN_DTYPE_FLOAT16; }, kInvalid,
       {"dk.dtype=float16"}, Pass::backward},
      {"backward_dv_overlaps", [](C& c, D&) { c.dv.strides[2] = 0; }, kInvalid, {"dv.strides[2]=0", "overlap"},
       Pass::backward},
      {"backward_dout_on_another_device", [](C& c, D&) { c.dout.device = FLASHATTN_DEVICE_CUDA; }, kInvalid,
       {"dout is on cuda:0"}, Pass::backward},
      {"backward_workspace_too_small",
       [](C& c, D&) {
         c.options.workspace = small_workspace.data();
         c.options.workspace_size = small_workspace.size();
       },
       FLASHATTN_ERROR_WORKSPACE_TOO_SMALL, {"options.workspace_size=16"}, Pass::backward},
  };
}

class InvalidCall : public ::testing::TestWithParam<InvalidInput> {};

TEST_P(InvalidCall, FailsWithItsStatusAndMessageAndWritesNothing) {
  const InvalidInput& bad = GetParam();
  CaseData data(valid_case(bad.varlen));
  if (bad.pass == Pass::backward) {
    ASSERT_EQ(data.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    data.poison_gradients();
  } else {
    data.poison_forward_outputs();
  }
  const std::vector<std::vector<uint8_t>> before{data.out.bytes(), data.lse.bytes(), data.dq.bytes(), data.dk.bytes(),
                                                 data.dv.bytes()};
  Call call(data, bad.pass);
  bad.corrupt(call, data);
  const flashattn_status status = call.run();
  const std::string message = flashattn_last_error();
  EXPECT_EQ(status, bad.status) << flashattn_status_string(status) << ": " << message;
  for (const std::string& part : bad.message)
    EXPECT_NE(message.find(part), std::string::npos) << "message \"" << message << "\" lacks \"" << part << "\"";
  const std::vector<std::vector<uint8_t>> after{data.out.bytes(), data.lse.bytes(), data.dq.bytes(), data.dk.bytes(),
                                                data.dv.bytes()};
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (size_t t = 0; t < before.size(); ++t) EXPECT_TRUE(before[t] == after[t]) << names[t] << " was written";
}

INSTANTIATE_TEST_SUITE_P(Inputs, InvalidCall, ::testing::ValuesIn(invalid_inputs()),
                         [](const ::testing::TestParamInfo<InvalidInput>& info) { return info.param.name; });

TEST(InvalidCall, ValidCasesPassThisHarness) {
  for (bool varlen : {false, true})
    for (Pass pass : {Pass::forward, Pass::backward}) {
      CaseData data(valid_case(varlen));
      ASSERT_EQ(data.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
      Call call(data, pass);
      EXPECT_EQ(call.run(), FLASHATTN_SUCCESS) << flashattn_last_error();
      EXPECT_STREQ(flashattn_last_error(), "");
    }
}

// Tensors on a CUDA device when no CUDA backend can run: the backend is unavailable, not a crash.
TEST(InvalidCall, CudaTensorsWithoutUsableCudaBackend) {
  if (flashattn_backend_available(FLASHATTN_BACKEND_CUDA)) GTEST_SKIP() << "a CUDA device is present";
  CaseData data(valid_case(false));
  data.poison_forward_outputs();
  const auto out_before = data.out.bytes();
  Call call(data, Pass::forward);
  call.options.backend = FLASHATTN_BACKEND_AUTO;
  move_to_cuda(call, data);
  EXPECT_EQ(call.run(), FLASHATTN_ERROR_BACKEND_UNAVAILABLE) << flashattn_last_error();
  EXPECT_NE(std::string(flashattn_last_error()).find("cuda"), std::string::npos) << flashattn_last_error();
  EXPECT_TRUE(data.out.bytes() == out_before);
}

}  // namespace
