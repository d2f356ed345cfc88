#include <gtest/gtest.h>

#include "tensor.h"

TEST(Tensor, ShapeAndNumel) {
  lab::Tensor t({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(lab::shape_str(t.shape), "[2, 3, 4]");
  t.resize({5});
  EXPECT_EQ(t.numel(), 5);
}
