// group_div (csrc/common/group_div.h), the KV-major kernel's i / G by a multiply, against the
// division: every row of every group size up to 128 (M3's 16 among them), and for every G up to
// the multiply form's bound the rows around each multiple of G, where a quotient changes. Both
// sides are non-decreasing in i, so agreeing at q G - 1, q G and q G + 1 for every q proves them
// equal on the whole range. A test that can fail: a magic one below ceil(2^32 / G) is wrong at
// i = G.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/group_div.h"

namespace flashmsa {
namespace {

TEST(GroupDiv, EveryRowOfSmallGroups) {
  for (int G = 1; G <= 128; ++G) {
    const uint32_t magic = group_div_magic(G);
    for (int i = 0; i < kGroupDivMaxRowsPerG * G; ++i) ASSERT_EQ(group_div(i, G, magic), i / G) << "G " << G << " i " << i;
  }
}

TEST(GroupDiv, QuotientStepsOfEveryGroupUpToTheBound) {
  for (int G = 2; G < kGroupDivMaxG; ++G) {
    const uint32_t magic = group_div_magic(G);
    ASSERT_NE(magic, 0u) << G;
    for (int q = 0; q <= kGroupDivMaxRowsPerG; ++q) {
      for (int d = -1; d <= 1; ++d) {
        const int i = q * G + d;
        if (i < 0 || i >= kGroupDivMaxRowsPerG * G) continue;
        ASSERT_EQ(group_div(i, G, magic), i / G) << "G " << G << " i " << i;
      }
    }
  }
}

TEST(GroupDiv, DividesBeyondTheBound) {
  EXPECT_EQ(group_div_magic(kGroupDivMaxG), 0u);
  EXPECT_EQ(group_div(5 * kGroupDivMaxG + 7, kGroupDivMaxG, 0u), 5);
  EXPECT_EQ(group_div_magic(1), 0u);
  EXPECT_EQ(group_div(12345, 1, 0u), 12345);
}

TEST(GroupDiv, AMagicOneTooSmallFails) {
  // The rounding up matters: floor(2^32 / 3) gives 0 for i = 3.
  const uint32_t low = uint32_t(0xFFFFFFFFull / 3u);
  EXPECT_EQ(group_div(3, 3, low), 0);
  EXPECT_EQ(group_div(3, 3, group_div_magic(3)), 1);
}

}  // namespace
}  // namespace flashmsa
