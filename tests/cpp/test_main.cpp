// GoogleTest main. Suites named Gpu* need a CUDA device and are skipped (reported as skipped, not
// passed) where there is none or where the build has no CUDA kernels.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
