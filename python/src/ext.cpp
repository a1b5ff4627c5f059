// The Python extension: DLPack arrays (numpy, PyTorch, CuPy, JAX, ...) in, the C API called on
// their memory as it is, no copies. Outputs are allocated by the Python side with the caller's
// framework and passed in here; this file only describes the arrays to the library and turns a
// failed status into a Python exception carrying the library's message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "flashattn/flashattn.h"

namespace nb = nanobind;

namespace {

using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

// Everything besides the arrays, filled field by field from Python.
struct CallOptions {
  float scale = 0.f;  // 0: 1/sqrt(head_dim)
  bool causal = false;
  int32_t window_left = -1;
  int32_t window_right = -1;
  float softcap = 0.f;
  float dropout_p = 0.f;
  uint64_t seed = 0;
  uint64_t offset = 0;
  int32_t max_seqlen_q = 0;  // varlen only
  int32_t max_seqlen_k = 0;
  bool deterministic = false;
  uintptr_t cuda_stream = 0;  // cudaStream_t of the caller's framework; 0: the default stream
};

std::string dtype_label(nb::dlpack::dtype t) {
  const char* kind = "unknown";
  switch (nb::dlpack::dtype_code(t.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: kind = "bool"; break;
    default: break;
  }
  return kind + std::to_string(int(t.bits));
}

flashattn_dtype dtype_of(nb::dlpack::dtype t, const char* name) {
  if (t == nb::dtype<float>()) return FLASHATTN_DTYPE_FLOAT32;
  if (t == nb::dtype<int32_t>()) return FLASHATTN_DTYPE_INT32;
  if (t.lanes == 1 && t.bits == 16 && t.code == uint8_t(nb::dlpack::dtype_code::Float)) return FLASHATTN_DTYPE_FLOAT16;
  if (t.lanes == 1 && t.bits == 16 && t.code == uint8_t(nb::dlpack::dtype_code::Bfloat))
    return FLASHATTN_DTYPE_BFLOAT16;
  throw nb::type_error((std::string(name) + ".dtype=" + dtype_label(t) +
                        " is not supported (float32, float16, bfloat16; int32 for cu_seqlens)")
                           .c_str());
}

// DLPack device types: 1 CPU, 2 CUDA, 3 CUDA pinned host memory (read by the CPU backend).
flashattn_device device_of(int32_t device_type, const char* name) {
  switch (device_type) {
    case 1:
    case 3: return FLASHATTN_DEVICE_CPU;
    case 2: return FLASHATTN_DEVICE_CUDA;
    default:
      throw nb::type_error((std::string(name) + " lives on DLPack device type " + std::to_string(device_type) +
                            "; only CPU and CUDA memory are supported")
                               .c_str());
  }
}

template <typename Array>
flashattn_tensor describe(const Array& a, const char* name) {
  if (a.ndim() > FLASHATTN_MAX_RANK)
    throw nb::value_error((std::string(name) + ".ndim=" + std::to_string(a.ndim()) + " must be at most " +
                           std::to_string(FLASHATTN_MAX_RANK))
                              .c_str());
  flashattn_tensor t{};
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = dtype_of(a.dtype(), name);
  t.device = device_of(a.device_type(), name);
  t.device_index = t.device == FLASHATTN_DEVICE_CUDA ? a.device_id() : 0;
  t.rank = int32_t(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    t.shape[i] = a.shape(i);
    t.strides[i] = a.stride(i);
  }
  return t;
}

template <typename Array>
std::optional<flashattn_tensor> describe(const std::optional<Array>& a, const char* name) {
  if (!a) return std::nullopt;
  return describe(*a, name);
}

const flashattn_tensor* ptr(const std::optional<flashattn_tensor>& t) { return t ? &*t : nullptr; }

[[noreturn]] void raise_status(flashattn_status status) {
  const std::string message = flashattn_last_error();
  switch (status) {
    case FLASHATTN_ERROR_INVALID_ARGUMENT:
    case FLASHATTN_ERROR_UNSUPPORTED: throw nb::value_error(message.c_str());
    case FLASHATTN_ERROR_OUT_OF_MEMORY:
      PyErr_SetString(PyExc_MemoryError, message.c_str());
      throw nb::python_error();
    default:
      throw std::runtime_error(std::string(flashattn_status_string(status)) + ": " + message);
  }
}

void check(flashattn_status status) {
  if (status != FLASHATTN_SUCCESS) raise_status(status);
}

// The C options for one call; the tensors they point to must outlive it.
struct Call {
  flashattn_options options;
  std::optional<flashattn_tensor> alibi, cu_q, cu_k;
  nb::object workspace;  // keeps the caller-allocated workspace alive during the call

  Call(const CallOptions& o, const std::optional<InArray>& alibi_slopes, const std::optional<InArray>& cu_seqlens_q,
       const std::optional<InArray>& cu_seqlens_k)
      : alibi(describe(alibi_slopes, "alibi_slopes")),
        cu_q(describe(cu_seqlens_q, "cu_seqlens_q")),
        cu_k(describe(cu_seqlens_k, "cu_seqlens_k")) {
    flashattn_options_init(&options);
    options.softmax_scale = o.scale;
    options.causal = o.causal;
    options.window_left = o.window_left;
    options.window_right = o.window_right;
    options.softcap = o.softcap;
    options.alibi_slopes = ptr(alibi);
    options.dropout_p = o.dropout_p;
    options.dropout_seed = o.seed;
    options.dropout_offset = o.offset;
    options.cu_seqlens_q = ptr(cu_q);
    options.cu_seqlens_k = ptr(cu_k);
    options.max_seqlen_q = o.max_seqlen_q;
    options.max_seqlen_k = o.max_seqlen_k;
    options.deterministic = o.deterministic;
    options.cuda_stream = reinterpret_cast<void*>(o.cuda_stream);
  }

  // With an allocator (a framework's caching allocator, say), the workspace comes from it;
  // without one the library allocates what it needs.
  void provide_workspace(size_t bytes, const std::optional<nb::callable>& allocate) {
    if (!allocate || bytes == 0) return;
    workspace = (*allocate)(bytes);
    const OutArray buffer = nb::cast<OutArray>(workspace);
    options.workspace = buffer.data();
    options.workspace_size = bytes;
  }
};

void forward(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
             const std::optional<OutArray>& lse, const CallOptions& o, const std::optional<InArray>& alibi_slopes,
             const std::optional<InArray>& cu_seqlens_q, const std::optional<InArray>& cu_seqlens_k,
             const std::optional<nb::callable>& allocate) {
  const flashattn_tensor tq = describe(q, "q"), tk = describe(k, "k"), tv = describe(v, "v");
  flashattn_tensor tout = describe(out, "out");
  std::optional<flashattn_tensor> tlse = describe(lse, "lse");
  Call call(o, alibi_slopes, cu_seqlens_q, cu_seqlens_k);
  flashattn_tensor* lse_ptr = tlse ? &*tlse : nullptr;
  if (allocate) {
    size_t bytes = 0;
    check(flashattn_forward_workspace_size(&tq, &tk, &tv, &tout, lse_ptr, &call.options, &bytes));
    call.provide_workspace(bytes, allocate);
  }
  flashattn_status status;
  {
    nb::gil_scoped_release unlocked;
    status = flashattn_forward(&tq, &tk, &tv, &tout, lse_ptr, &call.options);
  }
  check(status);
}

void backward(const InArray& dout, const InArray& q, const InArray& k, const InArray& v, const InArray& out,
              const InArray& lse, const OutArray& dq, const OutArray& dk, const OutArray& dv, const CallOptions& o,
              const std::optional<InArray>& alibi_slopes, const std::optional<InArray>& cu_seqlens_q,
              const std::optional<InArray>& cu_seqlens_k, const std::optional<nb::callable>& allocate) {
  const flashattn_tensor tdout = describe(dout, "dout"), tq = describe(q, "q"), tk = describe(k, "k"),
                         tv = describe(v, "v"), tout = describe(out, "out"), tlse = describe(lse, "lse");
  flashattn_tensor tdq = describe(dq, "dq"), tdk = describe(dk, "dk"), tdv = describe(dv, "dv");
  Call call(o, alibi_slopes, cu_seqlens_q, cu_seqlens_k);
  if (allocate) {
    size_t bytes = 0;
    check(flashattn_backward_workspace_size(&tdout, &tq, &tk, &tv, &tout, &tlse, &tdq, &tdk, &tdv, &call.options,
                                            &bytes));
    call.provide_workspace(bytes, allocate);
  }
  flashattn_status status;
  {
    nb::gil_scoped_release unlocked;
    status = flashattn_backward(&tdout, &tq, &tk, &tv, &tout, &tlse, &tdq, &tdk, &tdv, &call.options);
  }
  check(status);
}

flashattn_backend backend_named(const std::string& name) {
  if (name == "cpu") return FLASHATTN_BACKEND_CPU;
  if (name == "cuda") return FLASHATTN_BACKEND_CUDA;
  throw nb::value_error(("backend=\"" + name + "\" is not a backend (\"cpu\" or \"cuda\")").c_str());
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "Bindings of the flashattn C API over DLPack arrays";

  nb::class_<CallOptions>(m, "CallOptions")
      .def(nb::init<>())
      .def_rw("scale", &CallOptions::scale)
      .def_rw("causal", &CallOptions::causal)
      .def_rw("window_left", &CallOptions::window_left)
      .def_rw("window_right", &CallOptions::window_right)
      .def_rw("softcap", &CallOptions::softcap)
      .def_rw("dropout_p", &CallOptions::dropout_p)
      .def_rw("seed", &CallOptions::seed)
      .def_rw("offset", &CallOptions::offset)
      .def_rw("max_seqlen_q", &CallOptions::max_seqlen_q)
      .def_rw("max_seqlen_k", &CallOptions::max_seqlen_k)
      .def_rw("deterministic", &CallOptions::deterministic)
      .def_rw("cuda_stream", &CallOptions::cuda_stream);

  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("options"), nb::arg("alibi_slopes").none() = nb::none(), nb::arg("cu_seqlens_q").none() = nb::none(),
        nb::arg("cu_seqlens_k").none() = nb::none(), nb::arg("allocate").none() = nb::none(),
        "Writes attention(q, k, v) into out (and the log-sum-exp into lse, if given).");
  m.def("backward", &backward, nb::arg("dout"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("options"),
        nb::arg("alibi_slopes").none() = nb::none(), nb::arg("cu_seqlens_q").none() = nb::none(),
        nb::arg("cu_seqlens_k").none() = nb::none(), nb::arg("allocate").none() = nb::none(),
        "Writes the gradients of attention into dq, dk, dv.");
  m.def(
      "backend_available", [](const std::string& name) { return flashattn_backend_available(backend_named(name)) != 0; },
      nb::arg("name"), "Whether the backend (\"cpu\" or \"cuda\") is compiled in and has a device.");
  m.def("version", [] { return std::string(flashattn_version_string()); },
        "Version of the C library this extension runs.");
}
