#include <gtest/gtest.h>
#include <cmath>
#include <random>
#include <vector>
#include "core/validate.h"
#include "core/dtype.h"
#include "reference/oracle.h"

using namespace flashattn;

static flashattn_tensor dense(void* data, flashattn_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d) {
  flashattn_tensor t{};
  t.data = data; t.dtype = dt; t.rank = 4;
  t.shape[0] = b; t.shape[1] = s; t.shape[2] = h; t.shape[3] = d;
  t.strides[3] = 1; t.strides[2] = d; t.strides[1] = h * d; t.strides[0] = s * h * d;
  return t;
}

TEST(Smoke, ForwardBackwardMatchOracle) {
  for (int causal = 0; causal < 2; ++causal) {
  int B = 2, Sq = 77, Sk = 130, H = 4, Hk = 2, D = 40;
  std::mt19937 rng(1);
  std::normal_distribution<float> n;
  std::vector<float> q(B*Sq*H*D), k(B*Sk*Hk*D), v(B*Sk*Hk*D), o(B*Sq*H*D), lse(B*H*Sq), dout(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  for (auto* vec : {&q, &k, &v, &dout}) for (auto& x : *vec) x = n(rng);
  auto tq = dense(q.data(), FLASHATTN_DTYPE_FLOAT32, B, Sq, H, D), tk = dense(k.data(), FLASHATTN_DTYPE_FLOAT32, B, Sk, Hk, D),
       tv = dense(v.data(), FLASHATTN_DTYPE_FLOAT32, B, Sk, Hk, D), to = dense(o.data(), FLASHATTN_DTYPE_FLOAT32, B, Sq, H, D),
       tdo = dense(dout.data(), FLASHATTN_DTYPE_FLOAT32, B, Sq, H, D), tdq = dense(dq.data(), FLASHATTN_DTYPE_FLOAT32, B, Sq, H, D),
       tdk = dense(dk.data(), FLASHATTN_DTYPE_FLOAT32, B, Sk, Hk, D), tdv = dense(dv.data(), FLASHATTN_DTYPE_FLOAT32, B, Sk, Hk, D);
  flashattn_tensor tl{}; tl.data = lse.data(); tl.dtype = FLASHATTN_DTYPE_FLOAT32; tl.rank = 3; tl.shape[0]=B; tl.shape[1]=H; tl.shape[2]=Sq; tl.strides[2]=1; tl.strides[1]=Sq; tl.strides[0]=H*Sq;
  flashattn_options opt; flashattn_options_init(&opt); opt.causal = causal; opt.softcap = 3; opt.dropout_p = 0.2f; opt.dropout_seed = 5;
  ASSERT_EQ(flashattn_forward(&tq, &tk, &tv, &to, &tl, &opt), FLASHATTN_SUCCESS) << flashattn_last_error();
  ASSERT_EQ(flashattn_backward(&tdo, &tq, &tk, &tv, &to, &tl, &tdq, &tdk, &tdv, &opt), FLASHATTN_SUCCESS) << flashattn_last_error();
  CallArgs a; a.pass = Pass::backward; a.q=&tq; a.k=&tk; a.v=&tv; a.out=&to; a.lse=&tl; a.dout=&tdo; a.dq=&tdq; a.dk=&tdk; a.dv=&tdv; a.options=&opt;
  Params p; ASSERT_TRUE(build_params(a, &p).is_ok());
  auto r = reference::backward(p);
  double e = 0, el = 0, eq = 0, ek = 0, ev = 0;
  for (size_t i = 0; i < o.size(); ++i) e = std::max(e, std::abs(o[i] - r.out[i]));
  for (int b = 0; b < B; ++b) for (int h = 0; h < H; ++h) for (int i = 0; i < Sq; ++i) {
    double ref = r.lse[(b*Sq+i)*H+h], got = lse[(b*H+h)*Sq+i];
    if (std::isinf(ref)) { EXPECT_TRUE(std::isinf(got)); } else el = std::max(el, std::abs(ref-got)); }
  for (size_t i = 0; i < dq.size(); ++i) eq = std::max(eq, std::abs(dq[i] - r.dq[i]));
  for (size_t i = 0; i < dk.size(); ++i) ek = std::max(ek, std::abs(dk[i] - r.dk[i]));
  for (size_t i = 0; i < dv.size(); ++i) ev = std::max(ev, std::abs(dv[i] - r.dv[i]));
  printf("causal=%d out %.3g lse %.3g dq %.3g dk %.3g dv %.3g\n", causal, e, el, eq, ek, ev);
  EXPECT_LT(std::max({e, el, eq, ek, ev}), 1e-4);
  }
}
