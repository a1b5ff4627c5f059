/*
 * flashattn — exact, IO-aware attention (FlashAttention) with a stable C ABI.
 *
 * out = softmax(scale * q kᵀ + masks/biases) v, computed tile by tile with an online softmax so the
 * seqlen_q × seqlen_k score matrix is never stored; the backward pass recomputes it from the saved
 * log-sum-exp. Every entry point validates all of its arguments before it writes anything: on any
 * failure it returns a status, leaves every output byte untouched, and flashattn_last_error()
 * returns a message naming the argument and the offending value.
 *
 * Tensors (see flashattn_tensor): dense q [batch, seqlen_q, heads_q, d], k [batch, seqlen_k, heads_kv, d],
 * v [batch, seqlen_k, heads_kv, d_v], out [batch, seqlen_q, heads_q, d_v], lse [batch, heads_q, seqlen_q].
 * Variable length (cu_seqlens given): q [total_q, heads_q, d], k/v [total_k, heads_kv, d], out likewise,
 * lse [heads_q, total_q]. Strides are in elements; the last dimension must be contiguous.
 */
#ifndef FLASHATTN_FLASHATTN_H
#define FLASHATTN_FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#define FLASHATTN_VERSION_MAJOR 0
#define FLASHATTN_VERSION_MINOR 1
#define FLASHATTN_VERSION_PATCH 0
/* Single integer for comparisons: 10000 * major + 100 * minor + patch. */
#define FLASHATTN_VERSION \
  (FLASHATTN_VERSION_MAJOR * 10000 + FLASHATTN_VERSION_MINOR * 100 + FLASHATTN_VERSION_PATCH)

#if defined(_WIN32)
#  if defined(FLASHATTN_BUILDING)
#    define FLASHATTN_API __declspec(dllexport)
#  else
#    define FLASHATTN_API __declspec(dllimport)
#  endif
#else
#  define FLASHATTN_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum flashattn_status {
  FLASHATTN_SUCCESS = 0,
  FLASHATTN_ERROR_INVALID_ARGUMENT = 1, /* a shape, stride, dtype, pointer or value is wrong */
  FLASHATTN_ERROR_UNSUPPORTED = 2,      /* valid, but the chosen backend does not implement it */
  FLASHATTN_ERROR_BACKEND_UNAVAILABLE = 3, /* backend not compiled in, or no device present */
  FLASHATTN_ERROR_WORKSPACE_TOO_SMALL = 4,
  FLASHATTN_ERROR_OUT_OF_MEMORY = 5,
  FLASHATTN_ERROR_DEVICE = 6, /* a CUDA call failed */
  FLASHATTN_ERROR_INTERNAL = 7
} flashattn_status;

typedef enum flashattn_dtype {
  FLASHATTN_DTYPE_FLOAT32 = 0,
  FLASHATTN_DTYPE_FLOAT16 = 1,
  FLASHATTN_DTYPE_BFLOAT16 = 2,
  FLASHATTN_DTYPE_INT32 = 3 /* cu_seqlens only */
} flashattn_dtype;

typedef enum flashattn_device {
  FLASHATTN_DEVICE_CPU = 0,
  FLASHATTN_DEVICE_CUDA = 1
} flashattn_device;

typedef enum flashattn_backend {
  FLASHATTN_BACKEND_AUTO = 0, /* the fastest backend that supports the call, on the tensors' device */
  FLASHATTN_BACKEND_CPU = 1,
  FLASHATTN_BACKEND_CUDA = 2
} flashattn_backend;

typedef enum flashattn_pass {
  FLASHATTN_PASS_FORWARD = 0,
  FLASHATTN_PASS_BACKWARD = 1
} flashattn_pass;

#define FLASHATTN_MAX_RANK 4

/* A strided view of caller-owned memory. Dimensions past `rank` are ignored. */
typedef struct flashattn_tensor {
  void* data;
  flashattn_dtype dtype;
  flashattn_device device;
  int32_t device_index;
  int32_t rank;
  int64_t shape[FLASHATTN_MAX_RANK];
  int64_t strides[FLASHATTN_MAX_RANK]; /* in elements */
} flashattn_tensor;

/*
 * Everything besides the tensors. Initialise with flashattn_options_init() (or
 * FLASHATTN_OPTIONS_INIT), then set what differs: new fields are only ever appended, and
 * `struct_size` tells the library which ones the caller knows about.
 */
typedef struct flashattn_options {
  uint32_t struct_size;
  float softmax_scale;   /* 0 means 1/sqrt(d) */
  int32_t causal;        /* same as window (-1, 0); aligned bottom-right */
  int32_t window_left;   /* -1: unbounded. Key j is visible from query i iff */
  int32_t window_right;  /*   i + sk - sq - left <= j <= i + sk - sq + right */
  float softcap;         /* 0: off; else s = softcap * tanh(s / softcap) */
  const flashattn_tensor* alibi_slopes; /* NULL or float32 [heads_q] or [batch, heads_q] */
  float dropout_p;       /* in [0, 1); applied to the softmax probabilities */
  uint64_t dropout_seed;
  uint64_t dropout_offset;
  const flashattn_tensor* cu_seqlens_q; /* NULL, or int32 [batch + 1]: variable-length batch */
  const flashattn_tensor* cu_seqlens_k; /* given together with cu_seqlens_q */
  int32_t max_seqlen_q;  /* varlen only: an upper bound on the sequence lengths */
  int32_t max_seqlen_k;
  flashattn_backend backend;
  int32_t deterministic; /* backward: bit-identical results run to run */
  void* cuda_stream;     /* cudaStream_t; NULL is the default stream */
  void* workspace;       /* NULL: the library allocates what it needs */
  size_t workspace_size; /* bytes at `workspace`; query with flashattn_*_workspace_size */
  int32_t num_threads;   /* CPU backend; 0: all available */
} flashattn_options;

#define FLASHATTN_OPTIONS_INIT                                                                    \
  {                                                                                              \
    sizeof(flashattn_options), 0.0f, 0, -1, -1, 0.0f, NULL, 0.0f, 0, 0, NULL, NULL, 0, 0,       \
        FLASHATTN_BACKEND_AUTO, 0, NULL, NULL, 0, 0                                              \
  }

FLASHATTN_API void flashattn_options_init(flashattn_options* options);

/* Run-time version: FLASHATTN_VERSION of the library actually loaded, and as "major.minor.patch". */
FLASHATTN_API int flashattn_version(void);
FLASHATTN_API const char* flashattn_version_string(void);

FLASHATTN_API const char* flashattn_status_string(flashattn_status status);
/* Message of this thread's last failed call ("" after a success). Valid until the next call. */
FLASHATTN_API const char* flashattn_last_error(void);

/* Backends compiled in and usable now (a CUDA backend needs a device). */
FLASHATTN_API int flashattn_backend_available(flashattn_backend backend);
FLASHATTN_API const char* flashattn_backend_name(flashattn_backend backend);

/*
 * out = attention(q, k, v); lse (may be NULL) receives the natural-log log-sum-exp of each row's
 * scores, -inf for a row with no visible key (whose out row is 0).
 */
FLASHATTN_API flashattn_status flashattn_forward(const flashattn_tensor* q, const flashattn_tensor* k,
                                                 const flashattn_tensor* v, flashattn_tensor* out,
                                                 flashattn_tensor* lse,
                                                 const flashattn_options* options);

/* Gradients from dout and the forward's out and lse. dk, dv sum over the query heads of a group. */
FLASHATTN_API flashattn_status flashattn_backward(
    const flashattn_tensor* dout, const flashattn_tensor* q, const flashattn_tensor* k,
    const flashattn_tensor* v, const flashattn_tensor* out, const flashattn_tensor* lse,
    flashattn_tensor* dq, flashattn_tensor* dk, flashattn_tensor* dv, const flashattn_options* options);

/* Bytes of workspace the call would use; data pointers may be NULL. */
FLASHATTN_API flashattn_status flashattn_forward_workspace_size(
    const flashattn_tensor* q, const flashattn_tensor* k, const flashattn_tensor* v,
    const flashattn_tensor* out, const flashattn_tensor* lse, const flashattn_options* options,
    size_t* bytes);
FLASHATTN_API flashattn_status flashattn_backward_workspace_size(
    const flashattn_tensor* dout, const flashattn_tensor* q, const flashattn_tensor* k,
    const flashattn_tensor* v, const flashattn_tensor* out, const flashattn_tensor* lse,
    const flashattn_tensor* dq, const flashattn_tensor* dk, const flashattn_tensor* dv,
    const flashattn_options* options, size_t* bytes);

/*
 * Whether `options->backend` (AUTO: any backend) runs this problem, decided by the code that
 * dispatches. Only shapes, strides, dtypes and devices are read; data pointers may be NULL.
 * Returns FLASHATTN_SUCCESS, or the status and message the real call would fail with.
 */
FLASHATTN_API flashattn_status flashattn_supports(flashattn_pass pass, const flashattn_tensor* q,
                                                  const flashattn_tensor* k,
                                                  const flashattn_tensor* v,
                                                  const flashattn_options* options);

/* The backend AUTO would pick for this problem (after flashattn_supports succeeded). */
FLASHATTN_API flashattn_status flashattn_select_backend(flashattn_pass pass,
                                                        const flashattn_tensor* q,
                                                        const flashattn_tensor* k,
                                                        const flashattn_tensor* v,
                                                        const flashattn_options* options,
                                                        flashattn_backend* chosen);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_FLASHATTN_H */
