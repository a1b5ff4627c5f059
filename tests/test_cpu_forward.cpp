#include <gtest/gtest.h>

#include "reference/naive.h"
#include "support/compare.h"

using namespace flashattn;
using namespace flashattn::test;

TEST(CpuForwardDraft, MatchesOracle) {
  for (flashattn_dtype dt : {FLASHATTN_DTYPE_FLOAT32, FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16}) {
    Case c;
    c.dtype = dt;
    c.batch = 2; c.heads_q = 4; c.heads_kv = 2; c.seqlen_q = 77; c.seqlen_k = 130; c.head_dim = 40;
    c.causal = true; c.softcap = 3; c.dropout_p = 0.2f; c.dropout_seed = 5; c.row_pad = 3; c.layout = Layout::bhsd;
    CaseData data(c);
    ASSERT_EQ(data.forward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    ASSERT_EQ(data.backward(), FLASHATTN_SUCCESS) << flashattn_last_error();
    const Params p = data.params(Pass::backward);
    const auto oracle = reference::backward(p);
    const auto naive = reference::naive_backward(p);
    Check chk = check_forward(data, p, oracle, naive);
    chk += check_backward(data, p, oracle, naive);
    chk += check_written(data, Pass::forward);
    chk += check_written(data, Pass::backward);
    EXPECT_TRUE(chk.ok) << c.describe() << "\n" << chk.message;
    printf("%s ratio %.3f\n", c.describe().c_str(), chk.worst_ratio);
  }
}
