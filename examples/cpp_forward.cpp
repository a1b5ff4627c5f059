// Attention from C++: tensor views over std::vector, options, exceptions.
#include <flashattn/flashattn.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const int batch = 2, seqlen = 200, heads = 8, kv_heads = 2, dim = 64;  // grouped-query attention
  std::vector<float> q(batch * seqlen * heads * dim), k(batch * seqlen * kv_heads * dim), v(k.size()),
      out(q.size()), lse(batch * heads * seqlen);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.1f * float(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.1f * float(i)), v[i] = float(i % 5);

  using flashattn::Tensor;
  Tensor tq(q.data(), {batch, seqlen, heads, dim}), tk(k.data(), {batch, seqlen, kv_heads, dim}),
      tv(v.data(), {batch, seqlen, kv_heads, dim}), to(out.data(), {batch, seqlen, heads, dim}),
      tl(lse.data(), {batch, heads, seqlen});
  flashattn::forward(tq, tk, tv, to, &tl, flashattn::Options().window(32, 0).softcap(20.f));
  std::printf("flashattn %s: sliding-window GQA forward done, lse[0] = %g\n", flashattn::version().c_str(), lse[0]);

  try {
    flashattn::forward(tq, tk, tv, to, &tl, flashattn::Options().dropout(1.5f, 0));
  } catch (const flashattn::Error& e) {
    std::printf("caught: %s\n", e.what());
    return e.status() == FLASHATTN_ERROR_INVALID_ARGUMENT ? 0 : 1;
  }
  return 1;
}
