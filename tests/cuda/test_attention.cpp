// The CUDA backend against the float64 oracle with the 2x-naive criterion over the shared sweep
// (odd shapes, every mask, softcap, ALiBi, dropout, GQA, varlen with empty sequences), outputs
// poisoned and checked written; split-key and single-pass forwards; determinism of the
// deterministic backward. Skipped, saying so, without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda/device.h"
#include "cuda/dispatch.h"
#include "cuda/gpu_case.h"
#include "reference/naive.h"
#include "support/compare.h"

namespace flashattn::test {
namespace {

std::string case_name(const ::testing::TestParamInfo<NamedCase>& info) { return info.param.name; }

// True for what the CUDA backend rejects as unsupported (e.g. d != d_v), with its reason.
bool unsupported(GpuCase& g, Pass pass, std::string* why) {
  const flashattn_status s = g.supported(pass, why);
  EXPECT_TRUE(s == FLASHATTN_SUCCESS || s == FLASHATTN_ERROR_UNSUPPORTED) << *why;
  return s == FLASHATTN_ERROR_UNSUPPORTED;
}

// The pass's outputs written everywhere and within the 2x-naive bound of the float64 oracle.
Check forward_against_oracle(const CaseData& host) {
  const Params p = host.params(Pass::forward);
  Check check = check_written(host, Pass::forward);
  check += check_forward(host, p, reference::forward(p), reference::naive_forward(p));
  return check;
}
Check backward_against_oracle(const CaseData& host) {
  const Params p = host.params(Pass::backward);
  Check check = check_written(host, Pass::backward);
  check += check_backward(host, p, reference::backward(p), reference::naive_backward(p));
  return check;
}

class CudaAttention : public ::testing::TestWithParam<NamedCase> {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  }
};

TEST_P(CudaAttention, ForwardMatchesOracle) {
  const Case& c = GetParam().spec;
  GpuCase g(c);
  std::string why;
  if (unsupported(g, Pass::forward, &why)) GTEST_SKIP() << "unsupported by the cuda backend: " << why;
  ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error() << "\n" << c.describe();
  const Check check = forward_against_oracle(g.host);
  EXPECT_TRUE(check.ok) << c.describe() << "\n" << check.message;
}

TEST_P(CudaAttention, BackwardMatchesOracle) {
  const Case& c = GetParam().spec;
  GpuCase g(c);
  std::string why;
  if (unsupported(g, Pass::backward, &why)) GTEST_SKIP() << "unsupported by the cuda backend: " << why;
  ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error() << "\n" << c.describe();
  ASSERT_EQ(g.backward(), FLASHATTN_SUCCESS) << flashattn_last_error() << "\n" << c.describe();
  const Check check = backward_against_oracle(g.host);
  EXPECT_TRUE(check.ok) << c.describe() << "\n" << check.message;
}

INSTANTIATE_TEST_SUITE_P(Float16, CudaAttention, ::testing::ValuesIn(cuda_sweep(FLASHATTN_DTYPE_FLOAT16)), case_name);
INSTANTIATE_TEST_SUITE_P(Bfloat16, CudaAttention, ::testing::ValuesIn(cuda_sweep(FLASHATTN_DTYPE_BFLOAT16)), case_name);

class CudaAttentionRuns : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  }
};

Case dense_case(int batch, int heads, int seqlen, int head_dim, bool causal) {
  Case c;
  c.dtype = FLASHATTN_DTYPE_BFLOAT16;
  c.batch = batch;
  c.heads_q = c.heads_kv = heads;
  c.seqlen_q = c.seqlen_k = seqlen;
  c.head_dim = head_dim;
  c.causal = causal;
  c.backend = FLASHATTN_BACKEND_CUDA;
  return c;
}

// Enough (batch, head, query tile) blocks to fill the GPU: one pass, no key split.
TEST_F(CudaAttentionRuns, ForwardWithoutKeySplitMatchesOracle) {
  for (bool causal : {false, true}) {
    const Case c = dense_case(4, 32, 300, 64, causal);
    GpuCase g(c);
    ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    const Check check = forward_against_oracle(g.host);
    EXPECT_TRUE(check.ok) << c.describe() << "\n" << check.message;
  }
}

// Causal calls whose launch order interleaves the heads of a group, the last group partial
// (tile_shapes.h: the group's K and V, and in the backward Q, dO and dQ sums, within 32 MiB). One
// query row keeps the float64 oracle cheap beside 8k and 16k keys.
// Forward: 8 MiB of K and V per head at d = 128 and 16k keys, so 6 heads in groups of 4 and 2;
// 16 MiB at d = 256, so 3 heads in groups of 2 and 1.
TEST_F(CudaAttentionRuns, CausalForwardInHeadGroupsMatchesOracle) {
  for (const auto& [heads, head_dim] : {std::pair{6, 128}, std::pair{3, 256}}) {
    Case c = dense_case(1, heads, 1, head_dim, true);
    c.seqlen_k = 16384;
    GpuCase g(c);
    std::string why;
    if (unsupported(g, Pass::forward, &why)) GTEST_SKIP() << "unsupported by the cuda backend: " << why;
    ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    const Check check = forward_against_oracle(g.host);
    EXPECT_TRUE(check.ok) << c.describe() << "\n" << check.message;
  }
}

// Backward: about 8 MiB per kv head at d = 128 and 16k keys, so 5 heads in groups of 3 and 2;
// at d = 256 and 8k keys, 4 heads in groups of 3 and 1.
TEST_F(CudaAttentionRuns, CausalBackwardInHeadGroupsMatchesOracle) {
  for (const auto& [heads, head_dim, seqlen_k] : {std::tuple{5, 128, 16384}, std::tuple{4, 256, 8192}}) {
    Case c = dense_case(1, heads, 1, head_dim, true);
    c.seqlen_k = seqlen_k;
    GpuCase g(c);
    std::string why;
    if (unsupported(g, Pass::backward, &why)) GTEST_SKIP() << "unsupported by the cuda backend: " << why;
    ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(g.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    const Check check = backward_against_oracle(g.host);
    EXPECT_TRUE(check.ok) << c.describe() << "\n" << check.message;
  }
}

// Above d = 128 the forward's consumers take turns up to 1024 query rows and not beyond
// (sm90 Consumer::pingpong): both sides of the bound, causal (its first rows see no key) and not.
TEST_F(CudaAttentionRuns, ForwardAboveHeadDim128OnBothSidesOfThePingpongBound) {
  for (const int head_dim : {192, 256})
    for (const int seqlen_q : {1024, 1025})
      for (const bool causal : {false, true}) {
        Case c = dense_case(1, 2, seqlen_q, head_dim, causal);
        c.seqlen_k = 300;
        GpuCase g(c);
        std::string why;
        if (g.supported(Pass::forward, &why) == FLASHATTN_ERROR_UNSUPPORTED) continue;  // head dim not compiled in
        ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
        const Check check = forward_against_oracle(g.host);
        EXPECT_TRUE(check.ok) << c.describe() << "\n" << check.message;
      }
}

// Row maxima that grow from key block to key block: keys scaled up along the sequence (growth
// a lazy rescale may skip, at most 2^8 in the exponentials) and a few keys `spike` times larger
// (growth it must not skip; at 40 beyond 2^128, where exponentials against the old maximum
// overflow). A rescale skipped where a row's maximum moved past the bound, or applied to some
// rows of a warpgroup and not others, leaves O and lse off.
TEST_F(CudaAttentionRuns, ForwardFollowsRowMaximaGrowingAcrossKeyBlocks) {
  for (const int head_dim : {64, 128, 256}) {
    for (const float spike : {8.f, 40.f}) {
      for (const bool causal : {false, true}) {
        Case c = dense_case(2, 3, 1000, head_dim, causal);
        c.seqlen_q = 333;
        GpuCase g(c);
        std::string why;
        if (g.supported(Pass::forward, &why) == FLASHATTN_ERROR_UNSUPPORTED) continue;  // head dim not compiled in
        HostTensor& k = g.host.k;
        for (int64_t b = 0; b < k.size(0); ++b)
          for (int64_t j = 0; j < k.size(1); ++j) {
            const float growth = (j % 293 == 150 ? spike : 1.f) * (1.f + 3.f * float(j) / float(k.size(1)));
            for (int64_t h = 0; h < k.size(2); ++h)
              for (int64_t x = 0; x < k.size(3); ++x) k.set({b, j, h, x}, growth * k.at({b, j, h, x}));
          }
        g.upload_inputs();
        ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
        const Check check = forward_against_oracle(g.host);
        EXPECT_TRUE(check.ok) << c.describe() << ", spike " << spike << "\n" << check.message;
      }
    }
  }
}

// A repeated forward writes every element again, with the same bits: many tiles (more than the
// multiprocessors), a causal mask, and the library's workspace allocated anew for each call.
TEST_F(CudaAttentionRuns, RepeatedForwardWritesTheSameBits) {
  for (const int head_dim : {64, 128, 256}) {
    Case c = dense_case(3, 32, 700, head_dim, true);
    c.heads_kv = 8;
    GpuCase g(c);
    std::string why;
    if (g.supported(Pass::forward, &why) == FLASHATTN_ERROR_UNSUPPORTED) continue;  // head dim not compiled in
    ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    const std::vector<uint8_t> out = g.host.out.bytes(), lse = g.host.lse.bytes();
    for (int run = 0; run < 2; ++run) {
      g.poison_forward_outputs();
      ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
      EXPECT_EQ(g.host.out.unwritten_elements(), "") << c.describe() << ", run " << run + 2;
      EXPECT_TRUE(g.host.out.bytes() == out) << c.describe() << ": out differs in run " << run + 2;
      EXPECT_TRUE(g.host.lse.bytes() == lse) << c.describe() << ": lse differs in run " << run + 2;
    }
  }
}

// With about 100 KB of shared memory per block (compute capability 8.6 / 8.9, or
// FLASHATTN_CUDA_MAX_SMEM=101376 with FLASHATTN_CUDA_KERNELS=sm80 on a larger GPU), head dims up
// to 128 still have a backward: 64 keys per block instead of 128 (backward_narrow_block_n).
TEST_F(CudaAttentionRuns, BackwardFitsAHundredKilobytesUpToHeadDim128) {
  const int smem = cuda::device_info(0).max_smem_per_block;
  if (smem > 101376) GTEST_SKIP() << "cuda:0 offers " << smem << " bytes per block; the test needs at most 101376";
  for (const int head_dim : {72, 96, 128}) {
    for (const bool deterministic : {false, true}) {
      Case c = dense_case(2, 3, 333, head_dim, true);
      c.heads_kv = 1;
      GpuCase g(c);
      g.set_deterministic(deterministic);
      std::string why;
      ASSERT_EQ(g.supported(Pass::backward, &why), FLASHATTN_SUCCESS) << c.describe() << ": " << why;
      ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
      ASSERT_EQ(g.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
      const Check check = backward_against_oracle(g.host);
      EXPECT_TRUE(check.ok) << c.describe() << (deterministic ? " deterministic" : "") << "\n" << check.message;
    }
  }
}

// The deterministic backward gives the same bits run after run, and a correct result: with the
// narrow and the wide sm_90a backward (d = 64, 128 and 256; at d = 256 its deterministic kernel,
// which holds each step's last dQ box, with GQA and varlen too), with many key blocks taking turns
// at each dQ tile (causal, a sliding window with seqlen_q != seqlen_k and GQA, no mask, varlen
// with empty sequences), launched with the heads interleaved (short sequences) and head after
// head (the window's 17 key blocks), in two chains of turns (d = 64 without a mask from 4096
// keys: even and odd key blocks add to their own dq_accum copies; with and without softcap, whose
// kernel takes 64-row steps), and with batch x kv heads past the number of multiprocessors (more
// blocks than are resident at once: a block waits only for turns of blocks launched before it),
// with 64 (kv head, sequence) pairs (the sm80 kernel interleaves them in groups of 16), and with
// dropout.
TEST_F(CudaAttentionRuns, DeterministicBackwardIsBitIdentical) {
  std::vector<Case> cases = {dense_case(1, 2, 700, 128, true), dense_case(1, 2, 700, 64, true),
                             dense_case(2, 80, 300, 64, true)};
  cases[0].heads_kv = cases[1].heads_kv = 1;
  Case window = dense_case(1, 4, 1000, 128, false);
  window.heads_kv = 2;
  window.seqlen_k = 2100;
  window.window_left = 300;
  window.window_right = 40;
  cases.push_back(window);
  cases.push_back(dense_case(2, 3, 500, 128, false));
  cases.push_back(dense_case(1, 2, 300, 256, true));
  Case wide = dense_case(2, 4, 700, 256, false);  // d = 256: steps over two heads, many turns per tile
  wide.heads_kv = 2;
  cases.push_back(wide);
  Case chains = dense_case(2, 4, 200, 64, false);  // d = 64 from 4096 keys: two chains of turns
  chains.heads_kv = 2;
  chains.seqlen_k = 4500;
  cases.push_back(chains);
  chains.softcap = 30;  // the score-transform kernel: 64-row steps, the same two chains
  cases.push_back(chains);
  cases.push_back(dense_case(4, 16, 200, 64, false));  // 64 pairs: groups of them interleave
  Case dropout = dense_case(2, 4, 600, 128, false);  // the dropout kernels, their draws shared
  dropout.heads_kv = 2;
  dropout.dropout_p = 0.2f;
  dropout.dropout_seed = 11;
  cases.push_back(dropout);
  Case varlen = dense_case(1, 2, 1, 64, true);
  varlen.seqlens_q = {0, 900, 130, 1500};
  varlen.seqlens_k = {40, 1100, 130, 1500};
  cases.push_back(varlen);
  varlen.head_dim = 256;  // the wide kernel's partial key blocks and empty sequences
  cases.push_back(varlen);
  int ran = 0;
  for (const Case& c : cases) {
    GpuCase g(c);
    g.set_deterministic(true);
    // A GPU with less shared memory (or a capped one) may not serve every head dim's backward.
    std::string why;
    if (unsupported(g, Pass::backward, &why)) {
      std::printf("skipping %s: %s\n", c.describe().c_str(), why.c_str());
      continue;
    }
    ++ran;
    ASSERT_EQ(g.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(g.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    const std::vector<uint8_t> dq = g.host.dq.bytes(), dk = g.host.dk.bytes(), dv = g.host.dv.bytes();
    for (int run = 0; run < 3; ++run) {
      g.poison_gradients();
      ASSERT_EQ(g.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
      EXPECT_TRUE(g.host.dq.bytes() == dq) << c.describe() << ": dq differs in run " << run + 2;
      EXPECT_TRUE(g.host.dk.bytes() == dk) << c.describe() << ": dk differs in run " << run + 2;
      EXPECT_TRUE(g.host.dv.bytes() == dv) << c.describe() << ": dv differs in run " << run + 2;
    }
    const Check check = backward_against_oracle(g.host);
    EXPECT_TRUE(check.ok) << c.describe() << "\n" << check.message;
  }
  if (ran == 0) GTEST_SKIP() << "no case's backward is supported on this device";
}

// True where the sm_90a kernels may serve: compiled in, a compute capability 9.0 device, and
// not forced off with FLASHATTN_CUDA_KERNELS=sm80.
bool hopper_kernels_expected() {
#ifdef FLASHATTN_WITH_SM90
  const char* forced = std::getenv("FLASHATTN_CUDA_KERNELS");
  return cuda::device_info(0).compute_capability == 90 && !(forced && std::string(forced) == "sm80");
#else
  return false;
#endif
}

// On a compute capability 9.0 device the sm_90a forward serves every call without dropout
// (unless FLASHATTN_CUDA_KERNELS=sm80); dropout stays on the sm80 kernel, which draws its mask.
TEST_F(CudaAttentionRuns, Sm90ForwardServesHopperWithoutDropout) {
  Params p;
  p.pass = Pass::forward;
  p.dtype = DType::bf16;
  p.head_dim = p.head_dim_v = 96;
  p.device = FLASHATTN_DEVICE_CUDA;
  if (!cuda::head_dim_compiled(p.head_dim)) GTEST_SKIP() << "head dim 96 not compiled (FLASHATTN_HEAD_DIMS)";
  const bool hopper = hopper_kernels_expected();
  EXPECT_STREQ(cuda::forward_kernels(p), hopper ? "sm90" : "sm80");
  p.dropout_p = 0.1f;
  EXPECT_STREQ(cuda::forward_kernels(p), "sm80");
}

// The sm_90a backward serves every head dim without dropout (up to 128 the narrow kernel, above
// the wide one); with dropout the sm80 backward does.
TEST_F(CudaAttentionRuns, Sm90BackwardServesEveryHeadDimWithoutDropout) {
  Params p;
  p.pass = Pass::backward;
  p.dtype = DType::f16;
  p.device = FLASHATTN_DEVICE_CUDA;
  const bool hopper = hopper_kernels_expected();
  int checked = 0;
  for (int d : {40, 64, 96, 128, 192, 256}) {
    if (!cuda::head_dim_compiled(d)) continue;
    p.head_dim = p.head_dim_v = d;
    EXPECT_STREQ(cuda::backward_kernels(p), hopper ? "sm90" : "sm80") << "head dim " << d;
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no head dim compiled";
  p.head_dim = p.head_dim_v = 64;
  p.dropout_p = 0.1f;
  EXPECT_STREQ(cuda::backward_kernels(p), "sm80");
}

// What the backend cannot run is refused with the argument named, before anything is written.
TEST_F(CudaAttentionRuns, RejectsFloat32AndUnalignedStrides) {
  Case c = dense_case(1, 2, 16, 64, false);
  c.dtype = FLASHATTN_DTYPE_FLOAT32;
  {
    GpuCase g(c);
    std::string why;
    EXPECT_EQ(g.supported(Pass::forward, &why), FLASHATTN_ERROR_UNSUPPORTED);
    EXPECT_NE(why.find("float32"), std::string::npos) << why;
  }
  c.dtype = FLASHATTN_DTYPE_FLOAT16;
  c.row_pad = 3;
  {
    GpuCase g(c);
    std::string why;
    EXPECT_EQ(g.supported(Pass::forward, &why), FLASHATTN_ERROR_UNSUPPORTED);
    EXPECT_NE(why.find("stride"), std::string::npos) << why;
    EXPECT_EQ(g.forward(), FLASHATTN_ERROR_UNSUPPORTED);
    EXPECT_EQ(g.host.out.unwritten_elements().empty(), false) << "out was written by a refused call";
  }
}

}  // namespace
}  // namespace flashattn::test
