// One attention problem made concrete: its description, random inputs in host or device memory,
// the library's descriptors and options over them, and the forward/backward calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "args.h"
#include "core/params.h"
#include "device.h"
#include "flashattn/flashattn.h"

namespace flashattn::cli {

struct ProblemSpec {
  int batch = 1, heads_q = 8, heads_kv = 8, seqlen_q = 4096, seqlen_k = 4096, head_dim = 64;
  flashattn_dtype dtype = FLASHATTN_DTYPE_FLOAT32;
  bool causal = false;
  Window window;  // (-1, -1): none
  float softcap = 0;
  bool alibi = false;
  float dropout = 0;
  // Non-empty: a variable-length batch of these sequences (seqlen_q/k are then their maxima).
  std::vector<int32_t> varlen_q, varlen_k;
  uint64_t seed = 0;  // inputs and dropout

  bool varlen() const { return !varlen_q.empty(); }
  std::string describe() const;  // "B=1 Hq=8 Hkv=8 Nq=4096 Nk=4096 d=64 float32 causal"
};

// `base` with every value given on the command line put in; a window without --causal turns
// the causal mask off.
ProblemSpec with_flags(ProblemSpec base, const ProblemFlags& flags);

// FLOPs as the FlashAttention papers count them: 4 * d per visible (query, key) pair and head,
// a causal square problem counted as exactly half of the full one; backward = 2.5 x forward.
double forward_flops(const ProblemSpec& spec);
double backward_flops(const ProblemSpec& spec);

// The backend `requested` resolves to (AUTO: cuda when present, else cpu); throws when the
// requested one is not available.
flashattn_backend resolve_backend(flashattn_backend requested);

class Problem {
 public:
  // Validates the problem with the library from shapes alone, then allocates and fills the
  // inputs (and the backward's when `with_backward`). Throws CliError with the library's message.
  Problem(const ProblemSpec& spec, flashattn_backend backend, int threads, bool with_backward);
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  const ProblemSpec& spec() const { return spec_; }
  flashattn_backend backend() const { return backend_; }
  bool on_cuda() const { return backend_ == FLASHATTN_BACKEND_CUDA; }
  // Extra memory of each pass: all the library uses besides inputs and outputs, handed to it
  // as a workspace that is allocated once.
  size_t forward_workspace_bytes() const { return forward_workspace_; }
  size_t backward_workspace_bytes() const { return backward_workspace_; }

  void forward();
  void backward();  // after forward(): reads its out and lse

  // Copies out/lse (resp. dq/dk/dv) to host memory when they live on the device.
  void fetch_outputs();
  void fetch_gradients();
  // Params over the host copies, for the oracle.
  Params host_params(Pass pass) const;
  // The same, but out (and dq, dk, dv for the backward) are written into `outputs`, sized here:
  // where another implementation of the same problem puts its results.
  struct HostOutputs {
    std::vector<std::byte> out, dq, dk, dv;
  };
  Params host_params_into(Pass pass, HostOutputs& outputs) const;

 private:
  struct Tensor {
    flashattn_tensor desc{};  // what the library is given
    std::vector<std::byte> host;
    DeviceBuffer device;
    size_t bytes() const;
    flashattn_tensor host_view() const;
  };

  void describe_tensors();
  void query_workspaces();
  void use_workspace(size_t bytes);
  void allocate(Tensor& t);
  void fill_random(Tensor& t, uint64_t stream);
  void upload(Tensor& t);
  void fetch(Tensor& t);

  ProblemSpec spec_;
  flashattn_backend backend_;
  bool with_backward_;
  std::vector<int32_t> cu_seqlens_q_, cu_seqlens_k_;
  Tensor q_, k_, v_, out_, lse_, dout_, dq_, dk_, dv_, cu_q_, cu_k_, alibi_;
  flashattn_options options_{};
  size_t forward_workspace_ = 0, backward_workspace_ = 0;
  WorkspaceBuffer workspace_;  // the larger of the two
};

}  // namespace flashattn::cli
