// The C API around the computation: versions, status strings and messages, options defaults,
// backend queries that agree with the calls they describe, workspace queries and caller-provided
// workspaces; and the header-only C++ layer over it.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "support/attention_case.h"

using namespace flashattn;
using namespace flashattn::test;

namespace {

Case small_case() {
  Case c;
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.seqlen_q = 70;
  c.seqlen_k = 90;
  c.head_dim = 16;
  c.causal = true;
  c.num_threads = 2;
  return c;
}

std::string last_error() { return flashattn_last_error(); }

}  // namespace

TEST(Version, MacrosMatchTheLibraryAndTheBuild) {
  EXPECT_EQ(FLASHATTN_VERSION, FLASHATTN_VERSION_MAJOR * 10000 + FLASHATTN_VERSION_MINOR * 100 + FLASHATTN_VERSION_PATCH);
  EXPECT_EQ(flashattn_version(), FLASHATTN_VERSION);
  const std::string expected = std::to_string(FLASHATTN_VERSION_MAJOR) + "." + std::to_string(FLASHATTN_VERSION_MINOR) +
                               "." + std::to_string(FLASHATTN_VERSION_PATCH);
  EXPECT_EQ(std::string(flashattn_version_string()), expected);
  EXPECT_EQ(expected, FLASHATTN_PROJECT_VERSION) << "include/flashattn/flashattn.h and CMakeLists.txt disagree";
  EXPECT_EQ(flashattn::version(), expected);
}

TEST(Status, EveryStatusHasItsOwnString) {
  const flashattn_status all[] = {FLASHATTN_SUCCESS,
                                  FLASHATTN_ERROR_INVALID_ARGUMENT,
                                  FLASHATTN_ERROR_UNSUPPORTED,
                                  FLASHATTN_ERROR_BACKEND_UNAVAILABLE,
                                  FLASHATTN_ERROR_WORKSPACE_TOO_SMALL,
                                  FLASHATTN_ERROR_OUT_OF_MEMORY,
                                  FLASHATTN_ERROR_DEVICE,
                                  FLASHATTN_ERROR_INTERNAL};
  const std::string unknown = flashattn_status_string(flashattn_status(99));
  EXPECT_FALSE(unknown.empty());
  std::set<std::string> seen;
  for (flashattn_status s : all) {
    const std::string text = flashattn_status_string(s);
    EXPECT_FALSE(text.empty()) << int(s);
    EXPECT_NE(text, unknown) << int(s);
    EXPECT_TRUE(seen.insert(text).second) << "two statuses read \"" << text << "\"";
  }
  EXPECT_EQ(std::string(flashattn_status_string(FLASHATTN_SUCCESS)), "success");
}

TEST(Status, LastErrorIsPerThreadAndClearedBySuccess) {
  CaseData data(small_case());
  flashattn_options bad = data.options;
  bad.window_left = -3;
  ASSERT_EQ(flashattn_forward(data.q.desc(), data.k.desc(), data.v.desc(), data.out.desc(), nullptr, &bad),
            FLASHATTN_ERROR_INVALID_ARGUMENT);
  const std::string mine = last_error();
  EXPECT_NE(mine.find("options.window_left=-3"), std::string::npos) << mine;
  std::string other;
  std::thread([&] {
    flashattn_options other_bad = bad;
    other_bad.window_left = -1;
    other_bad.dropout_p = 2.f;
    flashattn_forward(data.q.desc(), data.k.desc(), data.v.desc(), data.out.desc(), nullptr, &other_bad);
    other = last_error();
  }).join();
  EXPECT_NE(other.find("options.dropout_p=2"), std::string::npos) << other;
  EXPECT_EQ(last_error(), mine) << "another thread's failure replaced this thread's message";
  ASSERT_EQ(data.forward(), FLASHATTN_SUCCESS) << last_error();
  EXPECT_EQ(last_error(), "");
}

TEST(Options, InitGivesTheDocumentedDefaults) {
  flashattn_options o;
  std::memset(&o, 0x5A, sizeof o);
  flashattn_options_init(&o);
  const flashattn_options macro = FLASHATTN_OPTIONS_INIT;
  for (const flashattn_options* x : {static_cast<const flashattn_options*>(&o), &macro}) {
    EXPECT_EQ(x->struct_size, sizeof(flashattn_options));
    EXPECT_EQ(x->softmax_scale, 0.f);
    EXPECT_EQ(x->causal, 0);
    EXPECT_EQ(x->window_left, -1);
    EXPECT_EQ(x->window_right, -1);
    EXPECT_EQ(x->softcap, 0.f);
    EXPECT_EQ(x->alibi_slopes, nullptr);
    EXPECT_EQ(x->dropout_p, 0.f);
    EXPECT_EQ(x->dropout_seed, 0u);
    EXPECT_EQ(x->dropout_offset, 0u);
    EXPECT_EQ(x->cu_seqlens_q, nullptr);
    EXPECT_EQ(x->cu_seqlens_k, nullptr);
    EXPECT_EQ(x->max_seqlen_q, 0);
    EXPECT_EQ(x->max_seqlen_k, 0);
    EXPECT_EQ(x->backend, FLASHATTN_BACKEND_AUTO);
    EXPECT_EQ(x->deterministic, 0);
    EXPECT_EQ(x->cuda_stream, nullptr);
    EXPECT_EQ(x->workspace, nullptr);
    EXPECT_EQ(x->workspace_size, 0u);
    EXPECT_EQ(x->num_threads, 0);
  }
  flashattn_options_init(nullptr);  // tolerated
}

TEST(Backends, CpuIsAlwaysAvailableAndNamed) {
  EXPECT_TRUE(flashattn_backend_available(FLASHATTN_BACKEND_CPU));
  EXPECT_TRUE(flashattn_backend_available(FLASHATTN_BACKEND_AUTO));
  EXPECT_EQ(std::string(flashattn_backend_name(FLASHATTN_BACKEND_CPU)), "cpu");
  EXPECT_EQ(std::string(flashattn_backend_name(FLASHATTN_BACKEND_CUDA)), "cuda");
  EXPECT_EQ(std::string(flashattn_backend_name(FLASHATTN_BACKEND_AUTO)), "auto");
  EXPECT_FALSE(flashattn_backend_available(flashattn_backend(42)));
}

namespace {

// A call description for the shape queries: the case's descriptors with the data pointers
// removed, as a caller that has not allocated yet would pass them.
struct ShapesOnly {
  flashattn_tensor q, k, v;
  explicit ShapesOnly(const CaseData& d) : q(*d.q.desc()), k(*d.k.desc()), v(*d.v.desc()) {
    q.data = k.data = v.data = nullptr;
  }
};

struct Variation {
  const char* name;
  void (*apply)(flashattn_tensor& q, flashattn_tensor& k, flashattn_tensor& v, flashattn_options& o);
};

const Variation kVariations[] = {
    {"valid", [](flashattn_tensor&, flashattn_tensor&, flashattn_tensor&, flashattn_options&) {}},
    {"auto backend", [](flashattn_tensor&, flashattn_tensor&, flashattn_tensor&, flashattn_options& o) {
       o.backend = FLASHATTN_BACKEND_AUTO;
     }},
    {"heads not divisible", [](flashattn_tensor&, flashattn_tensor& k, flashattn_tensor& v, flashattn_options&) {
       k.shape[2] = v.shape[2] = 3;
     }},
    {"head dim 512", [](flashattn_tensor& q, flashattn_tensor& k, flashattn_tensor&, flashattn_options&) {
       q.shape[3] = k.shape[3] = 512;
     }},
    {"cuda backend", [](flashattn_tensor&, flashattn_tensor&, flashattn_tensor&, flashattn_options& o) {
       o.backend = FLASHATTN_BACKEND_CUDA;
     }},
    {"tensors on cuda", [](flashattn_tensor& q, flashattn_tensor& k, flashattn_tensor& v, flashattn_options& o) {
       q.device = k.device = v.device = FLASHATTN_DEVICE_CUDA;
       o.backend = FLASHATTN_BACKEND_AUTO;
     }},
    {"dropout 1", [](flashattn_tensor&, flashattn_tensor&, flashattn_tensor&, flashattn_options& o) {
       o.dropout_p = 1.f;
     }},
    {"mixed dtypes", [](flashattn_tensor&, flashattn_tensor&, flashattn_tensor& v, flashattn_options&) {
       v.dtype = FLASHATTN_DTYPE_BFLOAT16;
     }},
};

}  // namespace

// supports() and select_backend() answer from the code that dispatches: the same status and
// message as the forward call itself, for valid and invalid problems alike.
TEST(Supports, AgreesWithTheForwardCall) {
  for (const Variation& var : kVariations) {
    CaseData data(small_case());
    ShapesOnly shapes(data);
    flashattn_options o = data.options;
    var.apply(shapes.q, shapes.k, shapes.v, o);
    flashattn_tensor q = *data.q.desc(), k = *data.k.desc(), v = *data.v.desc(), out = *data.out.desc();
    var.apply(q, k, v, o);
    // Keep out consistent with a changed device, so the comparison is about q, k, v and options.
    out.device = q.device;
    if (q.device == FLASHATTN_DEVICE_CUDA && flashattn_backend_available(FLASHATTN_BACKEND_CUDA)) continue;

    const flashattn_status supported = flashattn_supports(FLASHATTN_PASS_FORWARD, &shapes.q, &shapes.k, &shapes.v, &o);
    const std::string supported_message = last_error();
    flashattn_backend chosen = flashattn_backend(-1);
    const flashattn_status selected =
        flashattn_select_backend(FLASHATTN_PASS_FORWARD, &shapes.q, &shapes.k, &shapes.v, &o, &chosen);
    const std::string selected_message = last_error();
    const flashattn_status ran = flashattn_forward(&q, &k, &v, &out, nullptr, &o);
    const std::string ran_message = last_error();

    EXPECT_EQ(supported, ran) << var.name << ": supports says \"" << supported_message << "\", forward says \""
                              << ran_message << "\"";
    EXPECT_EQ(supported_message, ran_message) << var.name;
    EXPECT_EQ(selected, ran) << var.name;
    EXPECT_EQ(selected_message, ran_message) << var.name;
    if (ran == FLASHATTN_SUCCESS) {
      EXPECT_EQ(chosen, FLASHATTN_BACKEND_CPU) << var.name;
    }
  }
}

TEST(Supports, BackwardPassAndBadArguments) {
  CaseData data(small_case());
  ShapesOnly s(data);
  EXPECT_EQ(flashattn_supports(FLASHATTN_PASS_BACKWARD, &s.q, &s.k, &s.v, &data.options), FLASHATTN_SUCCESS)
      << last_error();
  EXPECT_EQ(flashattn_supports(flashattn_pass(7), &s.q, &s.k, &s.v, &data.options), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("pass=7"), std::string::npos) << last_error();
  EXPECT_EQ(flashattn_select_backend(FLASHATTN_PASS_FORWARD, &s.q, &s.k, &s.v, &data.options, nullptr),
            FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("chosen is NULL"), std::string::npos) << last_error();
  EXPECT_EQ(flashattn_supports(FLASHATTN_PASS_FORWARD, &s.q, &s.k, &s.v, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("options is NULL"), std::string::npos) << last_error();
}

namespace {

size_t forward_workspace(CaseData& d) {
  size_t bytes = 0;
  EXPECT_EQ(flashattn_forward_workspace_size(d.q.desc(), d.k.desc(), d.v.desc(), d.out.desc(), d.lse.desc(),
                                             &d.options, &bytes),
            FLASHATTN_SUCCESS)
      << last_error();
  return bytes;
}

size_t backward_workspace(CaseData& d) {
  size_t bytes = 0;
  EXPECT_EQ(flashattn_backward_workspace_size(d.dout.desc(), d.q.desc(), d.k.desc(), d.v.desc(), d.out.desc(),
                                              d.lse.desc(), d.dq.desc(), d.dk.desc(), d.dv.desc(), &d.options, &bytes),
            FLASHATTN_SUCCESS)
      << last_error();
  return bytes;
}

}  // namespace

// The queried size is enough, is used, and one byte less is refused before anything is written.
TEST(Workspace, CallerProvidedWorkspaceOfTheQueriedSize) {
  for (Pass pass : {Pass::forward, Pass::backward}) {
    const char* pass_name = pass == Pass::forward ? "forward" : "backward";
    CaseData own(small_case()), given(small_case());
    ASSERT_EQ(own.forward(), FLASHATTN_SUCCESS) << last_error();
    ASSERT_EQ(given.forward(), FLASHATTN_SUCCESS) << last_error();
    if (pass == Pass::backward) {
      ASSERT_EQ(own.backward(), FLASHATTN_SUCCESS) << last_error();
    }
    const size_t bytes = pass == Pass::forward ? forward_workspace(given) : backward_workspace(given);
    ASSERT_GT(bytes, 0u) << pass_name;

    std::vector<uint64_t> workspace((bytes + 7) / 8 + 1);
    given.options.workspace = workspace.data();
    given.options.workspace_size = bytes - 1;
    pass == Pass::forward ? given.poison_forward_outputs() : given.poison_gradients();
    const auto untouched = pass == Pass::forward ? given.out.bytes() : given.dq.bytes();
    const flashattn_status too_small = pass == Pass::forward ? given.forward() : given.backward();
    EXPECT_EQ(too_small, FLASHATTN_ERROR_WORKSPACE_TOO_SMALL) << pass_name;
    EXPECT_NE(last_error().find("options.workspace_size=" + std::to_string(bytes - 1)), std::string::npos)
        << last_error();
    EXPECT_NE(last_error().find(std::to_string(bytes)), std::string::npos) << "the needed size: " << last_error();
    EXPECT_TRUE((pass == Pass::forward ? given.out.bytes() : given.dq.bytes()) == untouched) << pass_name;

    std::memset(workspace.data(), 0xFF, workspace.size() * 8);
    given.options.workspace_size = bytes;
    ASSERT_EQ(pass == Pass::forward ? given.forward() : given.backward(), FLASHATTN_SUCCESS) << last_error();
    const auto* w = reinterpret_cast<const uint8_t*>(workspace.data());
    size_t changed = 0;
    for (size_t i = 0; i < bytes; ++i) changed += w[i] != 0xFF;
    EXPECT_GT(changed, 0u) << pass_name << ": the caller's workspace was not used";
    for (size_t i = bytes; i < workspace.size() * 8; ++i)
      ASSERT_EQ(w[i], 0xFF) << pass_name << ": written past the workspace at byte " << i;
    if (pass == Pass::forward) {
      EXPECT_TRUE(given.out.bytes() == own.out.bytes() && given.lse.bytes() == own.lse.bytes()) << pass_name;
    } else {
      EXPECT_TRUE(given.dq.bytes() == own.dq.bytes() && given.dk.bytes() == own.dk.bytes() &&
                  given.dv.bytes() == own.dv.bytes())
          << pass_name;
    }
  }
}

TEST(Workspace, QueriesNeedNoDataAndCheckTheirResultPointer) {
  CaseData d(small_case());
  const size_t with_data = forward_workspace(d);
  flashattn_tensor q = *d.q.desc(), k = *d.k.desc(), v = *d.v.desc(), out = *d.out.desc();
  q.data = k.data = v.data = out.data = nullptr;
  size_t bytes = 0;
  ASSERT_EQ(flashattn_forward_workspace_size(&q, &k, &v, &out, nullptr, &d.options, &bytes), FLASHATTN_SUCCESS)
      << last_error();
  EXPECT_EQ(bytes, with_data);
  EXPECT_EQ(flashattn_forward_workspace_size(&q, &k, &v, &out, nullptr, &d.options, nullptr),
            FLASHATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(last_error().find("bytes is NULL"), std::string::npos) << last_error();
}

// The CPU backend's extra memory never approaches N x N: O(tile) per thread, plus a packed copy of
// what every tile re-reads (the forward: one head's keys; the backward: one group's query rows)
// while that is at most 16 MiB per thread. Past that bound it stops growing with the sequence.
TEST(Workspace, CpuForwardAndBackwardDoNotGrowWithTheSequence) {
  auto sizes = [](int n) {
    Case c = small_case();
    c.batch = 1;
    c.heads_q = c.heads_kv = 1;
    c.seqlen_q = c.seqlen_k = n;
    c.head_dim = 64;
    c.num_threads = 2;
    CaseData d(c);
    return std::make_pair(forward_workspace(d), backward_workspace(d));
  };
  const auto small = sizes(256), large = sizes(8192), longer = sizes(1 << 16), longest = sizes(1 << 17);
  EXPECT_EQ(longer.first, longest.first) << "forward workspace grows past the packed-keys bound";
  EXPECT_EQ(longer.second, longest.second) << "backward workspace grows past the packed-rows bound";
  EXPECT_LT(longest.first, large.first) << "a head's keys past 16 MiB should not be packed whole";
  EXPECT_LT(longest.second, large.second) << "a group's rows past 16 MiB should not be packed whole";
  EXPECT_LT(small.first, large.first);
  EXPECT_LT(large.first, size_t(8192) * 8192 * 4 / 10) << "forward workspace is not small beside N x N";
  EXPECT_LT(large.second, size_t(8192) * 8192 * 4 / 10) << "backward workspace is not small beside N x N";
}

TEST(CppLayer, RunsAndThrowsWithStatusAndMessage) {
  std::vector<float> q(1 * 5 * 2 * 8, 0.5f), k(1 * 7 * 2 * 8, 0.25f), v(1 * 7 * 2 * 8, 1.f), out(q.size(), -1.f),
      lse(1 * 2 * 5);
  Tensor tq = Tensor::bshd(q.data(), FLASHATTN_DTYPE_FLOAT32, 1, 5, 2, 8);
  Tensor tk = Tensor::bshd(k.data(), FLASHATTN_DTYPE_FLOAT32, 1, 7, 2, 8);
  Tensor tv = Tensor::bshd(v.data(), FLASHATTN_DTYPE_FLOAT32, 1, 7, 2, 8);
  Tensor tout = Tensor::bshd(out.data(), FLASHATTN_DTYPE_FLOAT32, 1, 5, 2, 8);
  Tensor tlse(lse.data(), {1, 2, 5});
  flashattn::forward(tq, tk, tv, tout, &tlse, Options().causal().threads(1));
  for (float x : out) EXPECT_FLOAT_EQ(x, 1.f);  // every value row is all ones
  EXPECT_TRUE(flashattn::supports(FLASHATTN_PASS_FORWARD, tq, tk, tv));

  const Tensor bhsd = Tensor::bhsd(q.data(), FLASHATTN_DTYPE_FLOAT32, 1, 2, 5, 8);
  EXPECT_EQ(bhsd.size(1), 5);
  EXPECT_EQ(bhsd.stride(1), 8);
  EXPECT_EQ(bhsd.stride(2), 40);

  try {
    flashattn::forward(tq, tk, tv, tout, &tlse, Options().window(-4, 0));
    ADD_FAILURE() << "no exception";
  } catch (const flashattn::Error& e) {
    EXPECT_EQ(e.status(), FLASHATTN_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("options.window_left=-4"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(flashattn::supports(FLASHATTN_PASS_FORWARD, tq, tk, tv, Options().dropout(1.5f, 0)));
}
