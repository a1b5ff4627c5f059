/* Attention from C: forward and backward on a small causal problem, errors handled by status. */
#include <flashattn/flashattn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static flashattn_tensor bshd(float* data, int64_t b, int64_t s, int64_t h, int64_t d) {
  flashattn_tensor t = {0};
  t.data = data;
  t.dtype = FLASHATTN_DTYPE_FLOAT32;
  t.device = FLASHATTN_DEVICE_CPU;
  t.rank = 4;
  t.shape[0] = b, t.shape[1] = s, t.shape[2] = h, t.shape[3] = d;
  t.strides[0] = s * h * d, t.strides[1] = h * d, t.strides[2] = d, t.strides[3] = 1;
  return t;
}

int main(void) {
  enum { B = 1, S = 128, H = 4, D = 64 };
  const size_t n = (size_t)B * S * H * D;
  float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v), *out = malloc(n * sizeof *out);
  float* lse = malloc((size_t)B * H * S * sizeof *lse);
  for (size_t i = 0; i < n; ++i) q[i] = sinf((float)i), k[i] = cosf((float)i), v[i] = (float)(i % 7) - 3.f;

  flashattn_tensor tq = bshd(q, B, S, H, D), tk = bshd(k, B, S, H, D), tv = bshd(v, B, S, H, D), to = bshd(out, B, S, H, D);
  flashattn_tensor tl = {0};
  tl.data = lse, tl.dtype = FLASHATTN_DTYPE_FLOAT32, tl.rank = 3;
  tl.shape[0] = B, tl.shape[1] = H, tl.shape[2] = S;
  tl.strides[0] = H * S, tl.strides[1] = S, tl.strides[2] = 1;

  flashattn_options opt;
  flashattn_options_init(&opt);
  opt.causal = 1;
  flashattn_status st = flashattn_forward(&tq, &tk, &tv, &to, &tl, &opt);
  if (st != FLASHATTN_SUCCESS) {
    fprintf(stderr, "forward failed: %s: %s\n", flashattn_status_string(st), flashattn_last_error());
    return 1;
  }
  /* Causal: the first query sees only the first key, so its output is v[0]. */
  printf("flashattn %s: out[0][0][0][0..3] = %g %g %g %g (v[0] = %g %g %g %g), lse[0] = %g\n",
         flashattn_version_string(), out[0], out[1], out[2], out[3], v[0], v[1], v[2], v[3], lse[0]);

  flashattn_tensor bad = bshd(k, B, S, 3, D); /* 3 kv heads cannot serve 4 query heads */
  st = flashattn_forward(&tq, &bad, &tv, &to, &tl, &opt);
  printf("expected failure: %s: %s\n", flashattn_status_string(st), flashattn_last_error());
  const int ok = out[0] == v[0] && st == FLASHATTN_ERROR_INVALID_ARGUMENT;
  free(q), free(k), free(v), free(out), free(lse);
  return ok ? 0 : 1;
}
