// The CUDA backend: one decision function per question (which variant, how many key splits, how
// much workspace), shared by supports(), workspace_bytes() and run() so they cannot disagree.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "core/backend.h"
#include "cuda/device.h"
#include "cuda/dq_accum_layout.h"
#include "cuda/dispatch.h"
#include "cuda/launch.h"
#include "cuda/sm80/backward_kernel.cuh"
#include "cuda/sm80/forward_kernel.cuh"
#include "cuda/sm80/tile_shapes.h"
#include "cuda/sm90/tile_shapes.h"
#include "cuda/variants.h"

namespace flashattn::cuda {
namespace {

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<fp16>() { return DType::f16; }
template <>
constexpr DType dtype_of<bf16>() { return DType::bf16; }

using Launcher = Status (*)(const KernelParams&, cudaStream_t);

struct Variant {
  DType dtype;
  int head_dim;
  Launcher forward, backward;
  // Bytes of dynamic shared memory per block: the largest forward's, the smallest backward
  // configuration's, and the 128-key backward's, under which the backward takes
  // backward_narrow_block_n() keys per block (launch_backward_main_fitting).
  int forward_smem, backward_smem, backward_full_keys_smem;
};

#define FLASHATTN_VARIANT_ROW(T, D)                                                                      \
  Variant{dtype_of<T>(),                                                                                 \
          D,                                                                                             \
          &launch_forward<T, D>,                                                                         \
          &launch_backward<T, D>,                                                                        \
          forward_max_smem<T, D>(),                                                                      \
          BackwardConfig<T, D, 1, 64, backward_narrow_block_n(D)>::kSmemBytes,                           \
          BackwardConfig<T, D>::kSmemBytes},
constexpr Variant kVariants[] = {FLASHATTN_CUDA_FOR_EACH_VARIANT(FLASHATTN_VARIANT_ROW)};
#undef FLASHATTN_VARIANT_ROW
constexpr int kHeadDims[] = {FLASHATTN_CUDA_HEAD_DIMS};

// The compiled head dim that serves `d`: the smallest one >= d (zero padding inside the kernels).
int padded_head_dim(int d) {
  for (int compiled : kHeadDims)
    if (compiled >= d) return compiled;
  return 0;
}

const Variant* find_variant(DType dtype, int padded) {
  for (const Variant& v : kVariants)
    if (v.dtype == dtype && v.head_dim == padded) return &v;
  return nullptr;
}

// The sm_90a kernels of one pass, ascending head dims per dtype, ending in a row that never
// matches (a table may have no kernel).
struct HopperVariant {
  DType dtype;
  int head_dim;
  Launcher launch;
};
#ifdef FLASHATTN_WITH_SM90
#define FLASHATTN_SM90_FORWARD_ROW(T, D) HopperVariant{dtype_of<T>(), D, &sm90::launch_forward<T, D>},
#define FLASHATTN_SM90_BACKWARD_ROW(T, D) HopperVariant{dtype_of<T>(), D, &sm90::launch_backward<T, D>},
constexpr HopperVariant kHopperForwards[] = {FLASHATTN_SM90_FOR_EACH_VARIANT(FLASHATTN_SM90_FORWARD_ROW){
    DType::f32, 0, nullptr}};
constexpr HopperVariant kHopperBackwards[] = {
    FLASHATTN_SM90_BACKWARD_FOR_EACH_VARIANT(FLASHATTN_SM90_BACKWARD_ROW){DType::f32, 0, nullptr}};
#undef FLASHATTN_SM90_FORWARD_ROW
#undef FLASHATTN_SM90_BACKWARD_ROW
#else
constexpr HopperVariant kHopperForwards[] = {{DType::f32, 0, nullptr}};
constexpr HopperVariant kHopperBackwards[] = {{DType::f32, 0, nullptr}};
#endif

// FLASHATTN_CUDA_KERNELS=sm80 keeps every call on the mma.sync kernels (to test or compare them).
bool hopper_kernels_allowed() {
  const char* choice = std::getenv("FLASHATTN_CUDA_KERNELS");
  return !(choice && std::strcmp(choice, "sm80") == 0);
}

// The sm_90a kernel of `table` that serves `p`, if any: the smallest compiled head dim >= d, on
// a compute capability 9.0 device, for a call without dropout (the sm80 kernels draw it).
template <size_t N>
const HopperVariant* hopper_kernel(const Params& p, const HopperVariant (&table)[N]) {
  if (p.has_dropout() || !hopper_kernels_allowed() || device_info(p.device_index).compute_capability != 90)
    return nullptr;
  for (const HopperVariant& v : table)
    if (v.launch && v.dtype == p.dtype && v.head_dim >= p.head_dim) return &v;
  return nullptr;
}

// The forward that serves a call and its tile shape (choose_forward() below).
struct ForwardChoice {
  Launcher launch = nullptr;
  int padded = 0;  // head dim of the kernel (pitch of the split partials)
  int block_m = 0, block_n = 0;
  int blocks_per_sm = 0;  // resident blocks the split decision counts on
  int smem = 0;
  bool hopper = false;
  int splits = 1;  // key splits (forward_splits)
};

// Key splits of a forward: more than one only when batch x heads x query tiles cannot fill the
// GPU (its resident blocks). Among split counts that do not repeat a per-split block count, the
// smallest whose wave efficiency is within 85% of the best.
int forward_splits(const Params& p, const ForwardChoice& c) {
  const int64_t m_blocks = (int64_t(p.seqlen_q) + c.block_m - 1) / c.block_m;
  const int64_t n_blocks = (int64_t(p.seqlen_k) + c.block_n - 1) / c.block_n;
  const int64_t tiles = int64_t(p.batch) * p.heads_q * m_blocks;
  const int sms = device_info(p.device_index).multiprocessors;
  const double slots = double(c.blocks_per_sm) * sms;
  if (sms == 0 || tiles == 0 || n_blocks < 2 || double(tiles) >= 0.8 * slots) return 1;
  const int max_splits = int(std::min<int64_t>({128, sms, n_blocks}));
  auto blocks_per_split = [&](int s) { return (n_blocks + s - 1) / s; };
  auto efficiency = [&](int s) {
    if (s > 1 && blocks_per_split(s) == blocks_per_split(s - 1)) return 0.0;
    const double waves = double(tiles) * s / slots;
    return waves / double(int64_t(waves) + (waves > double(int64_t(waves)) ? 1 : 0));
  };
  double best = 0;
  for (int s = 1; s <= max_splits; ++s) best = std::max(best, efficiency(s));
  for (int s = 1; s <= max_splits; ++s)
    if (efficiency(s) >= 0.85 * best) return s;
  return 1;
}

// The forward that serves `p`: the sm_90a kernel where hopper_kernel() finds one, otherwise the
// sm80 kernel. Shapes, sizes and the key splits come from the chosen kernel's tables.
ForwardChoice choose_forward(const Params& p) {
  ForwardChoice c;
  if (const HopperVariant* hopper = hopper_kernel(p, kHopperForwards)) {
    const bool tall = sm90::forward_tall(hopper->head_dim, p.seqlen_q);
    const sm90::ForwardShape s = sm90::forward_shape(hopper->head_dim, tall);
    c = {hopper->launch, hopper->head_dim, s.block_m, s.block_n, 1, sm90::forward_smem_bytes(hopper->head_dim, tall),
         true};
  } else {
    const int padded = padded_head_dim(p.head_dim);
    const Variant* v = padded ? find_variant(p.dtype, padded) : nullptr;
    if (!v) return c;
    // The kernel launch_forward() picks: it reads dropout from the threshold, which is 0 for
    // probabilities below 2^-16 too.
    const bool dropout = semantics::Dropout::make(p.dropout_p, p.dropout_seed, p.dropout_offset).enabled();
    const ForwardShape s = forward_shape(padded, dropout, ScoreRule::is_general(p.scale, p.softcap, p.alibi));
    c = {v->forward, padded, s.block_m, s.block_n, 2, v->forward_smem, false};
  }
  c.splits = forward_splits(p, c);
  return c;
}

// The backward that serves a call (choose_backward() below).
struct BackwardChoice {
  Launcher launch = nullptr;
  int padded = 0;   // head dim of the kernel (pitch of dq_accum)
  int block_n = 0;  // keys per block
  int smem = 0;
  bool hopper = false;
  int dq_copies = 1;
  DqLayout dq_layout = DqLayout::plain;
};

// The backward that serves `p`: the sm_90a kernel where hopper_kernel() finds one (head dims up
// to 128), otherwise the sm80 kernel.
BackwardChoice choose_backward(const Params& p) {
  BackwardChoice c;
  if (const HopperVariant* hopper = hopper_kernel(p, kHopperBackwards)) {
    c = {hopper->launch, hopper->head_dim, sm90::backward_shape(hopper->head_dim).block_n,
         std::max(sm90::backward_smem_bytes(hopper->head_dim, false), sm90::backward_smem_bytes(hopper->head_dim, true)),
         true};
  } else {
    const int padded = padded_head_dim(p.head_dim);
    const Variant* v = padded ? find_variant(p.dtype, padded) : nullptr;
    if (!v) return c;
    const bool narrow =
        backward_takes_narrow_keys(padded, device_info(p.device_index).max_smem_per_block, v->backward_full_keys_smem);
    const int block_n = narrow ? backward_narrow_block_n(padded) : backward_shape(padded).block_n;
    c = {v->backward, padded, block_n, v->backward_smem, false};
  }
  // Deterministic adds take turns (dq_accum_layout.h); the sm90 kernel's in one or two chains.
  const bool masked = p.window_left >= 0 || p.window_right >= 0;
  c.dq_copies = c.hopper && p.deterministic ? sm90::backward_dq_chains(c.padded, masked, p.seqlen_k) : 1;
  // The sm80 backward adds row tiles where vector reductions exist (dq_accum_layout.h).
  const bool row_tiles = device_info(p.device_index).compute_capability >= 90;
  c.dq_layout = c.hopper ? DqLayout::fragments : row_tiles ? DqLayout::row_tiles : DqLayout::plain;
  return c;
}

// The kernels of a call: the forward or the backward, by its pass.
struct Choice {
  ForwardChoice forward;
  BackwardChoice backward;

  static Choice of(const Params& p) {
    Choice c;
    if (p.pass == Pass::forward)
      c.forward = choose_forward(p);
    else
      c.backward = choose_backward(p);
    return c;
  }
};

int64_t packed_rows_q(const Params& p) { return p.varlen() ? p.total_q : int64_t(p.batch) * p.seqlen_q; }

// 16-byte loads and stores need 16-byte aligned rows: the data pointer and every stride that
// is ever multiplied by a non-zero index must be a multiple of 8 elements.
Status check_operand(const Operand& o, const char* name, const Params& p, int64_t batch, int64_t rows, int64_t heads) {
  if (reinterpret_cast<uintptr_t>(o.data) % 16 != 0)
    return unsupported(name, ".data=", o.data, " must be 16-byte aligned for the cuda backend");
  const struct {
    int64_t stride, extent;
    const char* what;
  } dims[] = {{o.batch, batch, "batch"}, {o.row, rows, "sequence"}, {o.head, heads, "head"}};
  for (const auto& d : dims)
    if (d.extent > 1 && d.stride % 8 != 0)
      return unsupported(name, " ", d.what, " stride=", d.stride,
                         " must be a multiple of 8 elements (16 bytes) for the cuda backend");
  return Status::ok();
}

Status supports(const Params& p) {
  if (p.device != FLASHATTN_DEVICE_CUDA) return unsupported("the cuda backend needs tensors in device memory");
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return unsupported("q.dtype=float32: the cuda backend supports float16 and bfloat16");
  if (p.head_dim != p.head_dim_v)
    return unsupported("v head dim=", p.head_dim_v, " must equal q head dim=", p.head_dim, " on the cuda backend");
  if (p.head_dim % 8 != 0)
    return unsupported("head dim=", p.head_dim, " must be a multiple of 8 on the cuda backend");
  const int padded = padded_head_dim(p.head_dim);
  const Variant* variant = padded ? find_variant(p.dtype, padded) : nullptr;
  if (!variant)
    return unsupported("head dim=", p.head_dim, " exceeds the largest head dim compiled into the cuda backend (",
                       kHeadDims[std::size(kHeadDims) - 1], "; see FLASHATTN_HEAD_DIMS)");
  if (p.batch > 65535) return unsupported("batch=", p.batch, " exceeds 65535 on the cuda backend");
  if (p.heads_q > 65535) return unsupported("heads_q=", p.heads_q, " exceeds 65535 on the cuda backend");
  const int64_t rows_q = p.varlen() ? p.total_q : p.seqlen_q;
  const int64_t rows_k = p.seqlen_k;  // varlen: any row count > 1 needs an aligned stride too
  const bool backward = p.pass == Pass::backward;
  const struct {
    const Operand& o;
    const char* name;
    int64_t rows, heads;
    bool used;
  } operands[] = {{p.q, "q", rows_q, p.heads_q, true},         {p.k, "k", rows_k, p.heads_kv, true},
                  {p.v, "v", rows_k, p.heads_kv, true},        {p.out, "out", rows_q, p.heads_q, true},
                  {p.dout, "dout", rows_q, p.heads_q, backward}, {p.dq, "dq", rows_q, p.heads_q, backward},
                  {p.dk, "dk", rows_k, p.heads_kv, backward},   {p.dv, "dv", rows_k, p.heads_kv, backward}};
  for (const auto& op : operands)
    if (op.used) FA_TRY(check_operand(op.o, op.name, p, p.varlen() ? 1 : p.batch, p.varlen() ? 2 : op.rows, op.heads));

  const DeviceInfo info = device_info(p.device_index);
  if (info.compute_capability != 0 && info.compute_capability < 80)
    return unsupported("cuda:", p.device_index, " has compute capability ", info.compute_capability / 10, ".",
                       info.compute_capability % 10, "; the cuda backend needs 8.0 or newer");
  if (!backward) {
    const ForwardChoice forward = choose_forward(p);
    const int64_t tiles = sm90::forward_tiles(p.batch, p.heads_q, p.seqlen_q, forward.splits, forward.block_m);
    if (forward.hopper && tiles > sm90::kMaxForwardTiles)
      return unsupported("batch x heads_q x query tiles = ", tiles, " exceeds the ", sm90::kMaxForwardTiles,
                         " tiles of the sm90 forward");
  }
  const int smem = backward ? choose_backward(p).smem : choose_forward(p).smem;
  if (info.max_smem_per_block != 0 && smem > info.max_smem_per_block)
    return unsupported("head dim=", p.head_dim, " ", backward ? "backward" : "forward", " needs ", smem,
                       " bytes of shared memory per block; cuda:", p.device_index, " offers ", info.max_smem_per_block);
  return Status::ok();
}

// Workspace layout: each part 256-byte aligned.
struct Workspace {
  size_t partial_out = 0, partial_lse = 0, tile_counter = 0, delta = 0, lse_log2 = 0, dq_accum = 0, dq_turns = 0,
         total = 0;

  static size_t align(size_t bytes) { return (bytes + 255) / 256 * 256; }
  static Workspace of(const Params& p, const Choice& choice) {
    Workspace w;
    const ForwardChoice& forward = choice.forward;
    const BackwardChoice& backward = choice.backward;
    const size_t rows = size_t(packed_rows_q(p)) * size_t(p.heads_q);
    size_t at = 0;
    auto take = [&](size_t bytes) {
      const size_t start = at;
      at += align(bytes);
      return start;
    };
    if (p.pass == Pass::forward) {
      if (forward.splits > 1) {
        w.partial_out = take(size_t(forward.splits) * rows * forward.padded * sizeof(float));
        w.partial_lse = take(size_t(forward.splits) * rows * sizeof(float));
      }
      if (forward.hopper) w.tile_counter = take(sizeof(int));
    } else {
      w.delta = take(rows * sizeof(float));
      w.lse_log2 = take(rows * sizeof(float));
      w.dq_accum = take(size_t(backward.dq_copies) *
                        size_t(dq_accum_copy_floats(backward.dq_layout, packed_rows_q(p), p.heads_q, backward.padded)) *
                        sizeof(float));
      if (p.deterministic) {
        const size_t turns = size_t(backward_dq_turns(packed_rows_q(p), p.batch, p.heads_q));
        w.dq_turns = take(size_t(backward.dq_copies) * turns * sizeof(int));
      }
    }
    w.total = at;
    return w;
  }
};

size_t workspace_bytes(const Params& p) { return Workspace::of(p, Choice::of(p)).total; }

KernelParams kernel_params(const Params& p, const Choice& choice) {
  KernelParams k;
  k.q = p.q;
  k.k = p.k;
  k.v = p.v;
  k.out = p.out;
  k.dout = p.dout;
  k.dq = p.dq;
  k.dk = p.dk;
  k.dv = p.dv;
  k.lse = p.lse;
  k.lse_batch = p.lse_batch;
  k.lse_head = p.lse_head;
  k.cu_seqlens_q = p.varlen() ? p.cu_seqlens_q : nullptr;
  k.cu_seqlens_k = p.varlen() ? p.cu_seqlens_k : nullptr;
  k.batch = p.batch;
  k.heads_q = p.heads_q;
  k.heads_kv = p.heads_kv;
  k.group = p.group_size();
  k.seqlen_q = p.seqlen_q;
  k.seqlen_k = p.seqlen_k;
  k.head_dim = p.head_dim;
  k.rows_q = packed_rows_q(p);
  k.rows_k = p.varlen() ? p.total_k : int64_t(p.batch) * p.seqlen_k;
  k.scale = p.scale;
  k.softcap = p.softcap;
  k.window_left = p.window_left;
  k.window_right = p.window_right;
  k.fold_rows = p.fold_rows;
  k.alibi_slopes = p.alibi ? p.alibi_slopes : nullptr;
  k.alibi_batch = p.alibi_batch;
  const semantics::Dropout drop = semantics::Dropout::make(p.dropout_p, p.dropout_seed, p.dropout_offset);
  k.dropout_threshold = drop.threshold;
  k.dropout_inv_keep = drop.inv_keep;
  k.dropout_seed = drop.seed;
  k.dropout_offset = drop.offset;
  auto* base = static_cast<unsigned char*>(p.workspace);
  const Workspace w = Workspace::of(p, choice);
  if (p.pass == Pass::forward) {
    k.num_splits = choice.forward.splits;
    if (k.num_splits > 1) {
      k.partial_out = reinterpret_cast<float*>(base + w.partial_out);
      k.partial_lse = reinterpret_cast<float*>(base + w.partial_lse);
    }
    if (choice.forward.hopper) k.tile_counter = reinterpret_cast<int*>(base + w.tile_counter);
  } else {
    k.delta = reinterpret_cast<float*>(base + w.delta);
    k.lse_log2 = reinterpret_cast<float*>(base + w.lse_log2);
    k.dq_accum = reinterpret_cast<float*>(base + w.dq_accum);
    k.dq_copies = choice.backward.dq_copies;
    if (p.deterministic) k.dq_turns = reinterpret_cast<int*>(base + w.dq_turns);
    k.deterministic = p.deterministic ? 1 : 0;
    k.dq_layout = int(choice.backward.dq_layout);
  }
  return k;
}

bool available() { return device_count() > 0; }

Status run(const Params& p) {
  const int padded = padded_head_dim(p.head_dim);
  const Variant* variant = find_variant(p.dtype, padded);
  if (!variant) return supports(p);
  if (p.batch == 0 || p.heads_q == 0) return Status::ok();
  DeviceGuard guard(p.device_index);
  const Choice choice = Choice::of(p);
  const KernelParams k = kernel_params(p, choice);
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (p.pass == Pass::forward) return k.rows_q == 0 ? Status::ok() : choice.forward.launch(k, stream);
  return choice.backward.launch(k, stream);
}

void* allocate(size_t bytes, const Params& p) {
  DeviceGuard guard(p.device_index);
  void* ptr = nullptr;
  if (cudaMallocAsync(&ptr, bytes, static_cast<cudaStream_t>(p.stream)) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return ptr;
}

void release(void* ptr, const Params& p) {
  DeviceGuard guard(p.device_index);
  cudaFreeAsync(ptr, static_cast<cudaStream_t>(p.stream));
}

}  // namespace

const char* forward_kernels(const Params& p) { return choose_forward(p).hopper ? "sm90" : "sm80"; }
const char* backward_kernels(const Params& p) { return choose_backward(p).hopper ? "sm90" : "sm80"; }
bool head_dim_compiled(int head_dim) { return padded_head_dim(head_dim) != 0; }

}  // namespace flashattn::cuda

namespace flashattn {

const BackendOps& cuda_backend() {
  static const BackendOps ops{Backend::cuda,           "cuda",          &cuda::available, &cuda::supports,
                              &cuda::workspace_bytes,  &cuda::run,      &cuda::allocate,  &cuda::release};
  return ops;
}

}  // namespace flashattn
