// A test case's tensors mirrored in device memory: the host CaseData (inputs drawn, outputs
// poisoned) is copied over, the CUDA backend runs on the device views, and results come back into
// the host tensors so the shared checks (support/compare.h) read them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/test_device.h"
#include "support/attention_case.h"
#include "support/sweep.h"

namespace flashattn::test {

class GpuCase {
 public:
  explicit GpuCase(const Case& c);

  CaseData host;
  // The pass's status from flashattn_supports on the CUDA backend, and its message.
  flashattn_status supported(Pass pass, std::string* message) const;
  flashattn_status forward();   // then out and lse are back in `host`
  flashattn_status backward();  // uses the device out/lse of forward(); dq, dk, dv back in `host`
  void set_deterministic(bool on) { options_.deterministic = on ? 1 : 0; }
  // Poison again, on the device too, so that a repeated pass must write every element anew.
  void poison_forward_outputs();
  void poison_gradients();
  // Copies q, k, v and dout over again, after a test has changed them in `host`.
  void upload_inputs();

 private:
  struct Mirror {
    HostTensor* host;
    std::unique_ptr<DeviceBuffer<uint8_t>> device;
    flashattn_tensor view;
  };
  Mirror mirror(HostTensor& t);
  static void download(Mirror& m);
  static void upload(Mirror& m);

  Mirror q_, k_, v_, out_, lse_, dout_, dq_, dk_, dv_, alibi_, cu_q_, cu_k_;
  flashattn_options options_;
};

// The CUDA backend's share of the sweep: 16-bit dtypes, the compiled head dims and odd ones that
// round up to them, padded rows kept 16-byte aligned.
std::vector<NamedCase> cuda_sweep(flashattn_dtype dtype);

}  // namespace flashattn::test
