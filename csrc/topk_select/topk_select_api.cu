// flashmsa::cuda::topk_select: launch of the top-k selection kernel its plan names.
//
// Three kernels, one result (bit-identical, docs/design/topk_select.md):
//   * warp per row (topk_select_kernel.cuh): a warp chooses one row at a time; 32 tokens per CTA
//     (warp_per_row), or 8 for decode-sized calls (warp_per_row_8: 4x the CTAs, a row per warp);
//   * thread per row (topk_radix_kernel.cuh, radix): a lane owns a row; for many rows. Its lean
//     variant radix_1buf (fewer instructions per row, one chunk buffer for more warps per SM);
//     radix_uniform is radix_1buf with branch-free passes of warp-uniform trip counts (by_size's
//     kernel for large calls);
//   * split rows (topk_split_kernel.cuh, warp_split): a CTA per row, its chunks over up to 8
//     warps, one warp merges their choices: decode-sized calls with long rows; warp_digits
//     is warp_split with one-chunk rows' thresholds by 8-bit radix digits;
//   * sorting networks (topk_net_kernel.cuh, net; auto's kernel where it runs): L lanes per row keep the K
//     smallest words (truncated order key | block offset) by 16-input networks, merged by shuffles,
//     an exact second pass where the cut ties on truncated keys; decode-sized calls take a pivot
//     first: a CTA of 4 warps a row counting order statistics, or (forced) a warp a row sorting.
// plan_topk_select (include/flashmsa/plan.h) picks one from the options: auto is net where it
// runs (rows choosing <= 31 of <= 32768 blocks), else by_size (radix_uniform for large calls,
// warp_split for decode-sized calls with few rows per SM, warp_per_row_8 for the other small ones).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/cuda_utils.h"
#include "cuda_ops.h"
#include "flashmsa/error.h"
#include "flashmsa/plan.h"
#include "topk_select/topk_net_launch.h"
#include "topk_select/topk_radix_kernel.cuh"
#include "topk_select/topk_select_kernel.cuh"
#include "topk_select/topk_split_kernel.cuh"

namespace flashmsa::cuda {
namespace {

template <int kTok>
void launch_warp_rows(const TopkSelectParams& p, cudaStream_t stream) {
  topk::KernelParams kp{};
  kp.p = p;
  kp.token_groups = ceil_div_int(p.num_tokens, kTok);
  const int64_t items = int64_t(kp.token_groups) * p.num_heads;
  MSA_CHECK_SUPPORTED(items <= INT_MAX, "topk_select: ", p.num_heads, " heads x ", p.num_tokens,
                      " tokens exceed the kernel's work-item range");
  kp.items = int(items);
  // Rows longer than one chunk double-buffer the chunks (the next one loads while this one is
  // chosen from).
  kp.num_buffers = p.num_blocks > topk::kChunk ? 2 : 1;
  const size_t smem = topk::smem_bytes<kTok>(kp.num_buffers);
  prepare_launch(topk::topk_select_kernel<kTok>, topk::kThreads, smem);

  const dim3 grid(unsigned(kp.items));
  topk::topk_select_kernel<kTok><<<grid, topk::kThreads, smem, stream>>>(kp);
  MSA_CHECK_LAUNCH();
}

// warp_split: a CTA per (token, head) row (CTA b = row b of out[S, H, topk]).
void launch_split_rows(const TopkSelectParams& p, cudaStream_t stream) {
  const int rows = topk::row_grid(p);
  prepare_launch(topk::split::topk_split_kernel, topk::kThreads, 0);
  topk::split::topk_split_kernel<<<dim3(unsigned(rows)), topk::kThreads, 0, stream>>>(p);
  MSA_CHECK_LAUNCH();
}

// warp_digits: where every row is one chunk (num_blocks <= kChunk), a one-warp CTA per row with
// the threshold by 8-bit digits; longer rows run as warp_split.
void launch_digit_rows(const TopkSelectParams& p, cudaStream_t stream) {
  static_assert(topk::kChunk == kTopkDigitsChunk, "plan.h's chunk of warp_digits is the kernel's");
  if (p.num_blocks > topk::kChunk) return launch_split_rows(p, stream);
  const int rows = topk::row_grid(p);
  prepare_launch(topk::split::topk_digits_kernel, 32, 0);
  topk::split::topk_digits_kernel<<<dim3(unsigned(rows)), 32, 0, stream>>>(p);
  MSA_CHECK_LAUNCH();
}

template <class V>
void launch_radix(const TopkSelectParams& p, int64_t groups, cudaStream_t stream) {
  topk::radix::Params rp{};
  rp.p = p;
  rp.token_groups = ceil_div_int(p.num_tokens, 32);
  rp.groups = int(groups);
  rp.carry = topk_carry(p);
  rp.vec = (p.num_tokens % 4 == 0 && reinterpret_cast<uintptr_t>(p.score) % 16 == 0) ? 1 : 0;
  const size_t smem = V::smem_bytes(rp.carry);
  prepare_launch(topk::radix::topk_radix_kernel<V>, V::kThreads, smem);
  // One warp per group of 32 tokens, longest rows first (the kernel's group order): a persistent
  // grid with a fixed stride would give some warps only short causal rows and others only long
  // ones; the hardware's CTA scheduling balances them instead.
  const int64_t ctas = ceil_div_int<int64_t>(groups, V::kWarps);
  topk::radix::topk_radix_kernel<V><<<dim3(unsigned(ctas)), V::kThreads, smem, stream>>>(rp);
  MSA_CHECK_LAUNCH();
}

void launch_net(const TopkSelectParams& p, const TopkSelectPlan& plan, cudaStream_t stream) {
  // The plan's bounds (topk_net_unsupported), which the words rely on: a row chooses fewer
  // blocks than a lane keeps words, and an offset fits 15 bits.
  MSA_CHECK(topk_carry(p) < plan.net_words && p.num_blocks <= topk::net::kMaxSpan,
            "topk_select: the plan's net kernel does not fit the call");
  if (plan.net_pivot > 0) {
    // A warp per row with the pivot first (topk_net_pivot_unsupported: K = 16 words, rows of at
    // most 32 x net_pivot blocks).
    MSA_CHECK(plan.net_words == 16 && plan.net_lanes == 32 && p.num_blocks <= 32 * plan.net_pivot,
              "topk_select: the plan's net pivot does not fit the call");
    return topk::launch_net_pivot(p, plan.net_pivot, plan.net_pivot_mode, stream);
  }
  if (plan.net_words == 16) return topk::launch_net_words16(p, plan.net_lanes, stream);
  if (plan.net_words == 32) return topk::launch_net_words32(p, plan.net_lanes, stream);
  MSA_FAIL("topk_select: the plan's net_words ", plan.net_words, " is not 16 or 32");
}

}  // namespace

TopkSelectDeviceFacts topk_select_facts() { return TopkSelectDeviceFacts{current_device_limits().num_sms}; }

void topk_select(const TopkSelectParams& p, const TopkSelectPlan& plan, cudaStream_t stream) {
  // p comes from make_topk_select_params: 1 <= topk <= 64 and force_begin + force_end <= topk are
  // its invariants (checked there, once); this launcher checks only what the launch itself needs.
  if (p.num_tokens <= 0 || p.num_heads <= 0) return;  // an empty output

  const int64_t groups = int64_t(ceil_div_int(p.num_tokens, 32)) * p.num_heads;
  MSA_CHECK_SUPPORTED(groups <= INT_MAX, "topk_select: ", p.num_heads, " heads x ", p.num_tokens,
                      " tokens exceed the kernel's work-item range");
  switch (plan.kernel) {
    case TopkKernel::kRadix: launch_radix<topk::radix::Classic>(p, groups, stream); break;
    case TopkKernel::kRadix1Buf: launch_radix<topk::radix::Lean1Buf>(p, groups, stream); break;
    case TopkKernel::kRadixUniform: launch_radix<topk::radix::Uniform1Buf>(p, groups, stream); break;
    case TopkKernel::kWarpPerRow8: launch_warp_rows<topk::kTokensSmall>(p, stream); break;
    case TopkKernel::kWarpPerRow: launch_warp_rows<topk::kTokens>(p, stream); break;
    case TopkKernel::kWarpSplit: launch_split_rows(p, stream); break;
    case TopkKernel::kWarpDigits: launch_digit_rows(p, stream); break;
    case TopkKernel::kNet: launch_net(p, plan, stream); break;
    default: MSA_FAIL("topk_select: the plan's kernel ", option_name(plan.kernel), " has no launcher");
  }
}

}  // namespace flashmsa::cuda
