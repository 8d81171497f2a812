// Combine of the split schedules (query-major split-K and KV-major): one warp per (row, head)
// reads the row's partial LSEs (lanes = slots), weights w_s = 2^(lse_s - max) and sums the partial
// outputs, so the result is deterministic. Slots with LSE -inf (empty, or never written by the
// attention kernel and set to -inf by the list builder, or with the KV-major lists=once by the
// previous group's combine: reset_lse) get weight 0 and their output is not read;
// other partial values are clamped to +-FLT_MAX so garbage can never turn a zero weight into NaN
// (0 * inf). A row with no finite slot gets output 0 and LSE -inf.
//
// The kernel is a pure stream of the partials (KV-major prefill: 8.6 GB of bf16 at 32K tokens), so
// it is shaped for bandwidth: a half-warp covers one slot's 128 values with 16-byte loads (8 values
// per lane), the two half-warps take the even and odd slots, and each lane issues the loads of a
// batch of 16 slots before using any of them (8 loads, 128 bytes in flight per lane, 4 KB per warp)
// so the memory system sees enough requests. The half-warp sums meet through one shuffle at the
// end: a fixed order, independent of the launch.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>

#include "common/cuda_utils.h"
#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/combine.cuh"
#include "sparse_attn/launch.h"

namespace flashmsa::sparse_attn {

namespace {

constexpr int kCombineWarps = 8;
// Grid bound of the combine: CTAs per SM (a few waves of the ~3 resident ones).
constexpr int kCombineCtasPerSm = 32;

// Units of work: (kv head, run of unit_rows rows, unit_heads of its G heads), taken by CTAs in a
// grid-stride loop (a bounded grid) and by the CTA's warps in turn. With shared-selection tiles a
// unit is one tile (max(1, 128 / G) rows x G heads, about 128 (row, head) pairs; launch.h: the tile
// kernel uses the same rows), so a tile done there costs one flag read and no work; without, the
// launcher shortens the units for calls of few rows (combine_launch_unit_rows / _heads).
//
// kSpec (CombineArgs::all_slots_written, the decode combine) is a template parameter rather than a
// branch in one kernel: the speculative first batch needs 32 more registers, and with both paths in
// one kernel the KV-major combine paid them too (117-123 registers for 16-bit partials, 2 CTAs of 8
// warps per SM; 80 without, 3 CTAs; f32 partials, 118, would spill at 3).
template <typename OutElem, StoreKind kKind, bool kSpec>
__global__ void __launch_bounds__(kCombineWarps * 32, kSpec || kKind == StoreKind::kF32 ? 1 : 3)
    combine_kernel(const __grid_constant__ CombineArgs a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t = a.unit_rows;
  const int first = a.row_begin / t;
  const int per_head = (a.row_begin + a.rows - 1) / t - first + 1;
  const int parts = a.group / a.unit_heads;  // head parts of a kv head
  const int units = a.num_kv_heads * parts * per_head;  // < INT_MAX (launcher)
  for (int u = blockIdx.x; u < units; u += gridDim.x) {  // CTA-uniform loop
    const int kh = u / (parts * per_head), rest = u % (parts * per_head);
    const int tile = first + rest / parts, g0 = (rest % parts) * a.unit_heads;
    if (a.union_done != nullptr && a.union_done[int64_t(kh) * a.union_num_tiles + tile]) continue;
    const int r_begin = max(tile * t, a.row_begin);
    const int r_end = min((tile + 1) * t, a.row_begin + a.rows);
    const int n = (r_end - r_begin) * a.unit_heads;
    for (int i = warp; i < n; i += kCombineWarps) {  // warp-uniform loop
      const int e = i / a.unit_heads;
      const int rel = r_begin - a.row_begin + e, g = g0 + i - e * a.unit_heads;
      const int64_t base = (int64_t(kh) * a.row_stride + rel) * a.num_slots * a.group + g;
      const int64_t out_idx = (int64_t(a.row_begin) + rel) * a.num_heads + kh * a.group + g;
      combine_row<OutElem, kKind, kSpec>(a, base, out_idx, lane);
    }
  }
}

}  // namespace

void launch_combine(const CombineArgs& args, DType out_dtype, cudaStream_t stream) {
  if (args.rows <= 0) return;
  MSA_CHECK(args.unit_rows == combine_unit_rows(args.group) &&
                (args.union_done == nullptr || args.union_tile_tokens == args.unit_rows),
            "combine: work units must be the shared-selection tiles");
  const int num_sms = flashmsa::cuda::current_device_limits().num_sms;
  CombineArgs a = args;
  a.unit_rows = combine_launch_unit_rows(args, num_sms);
  a.unit_heads = combine_launch_unit_heads(args, a.unit_rows, num_sms, kCombineWarps);
  const int64_t per_head = (int64_t(a.row_begin) + a.rows - 1) / a.unit_rows - a.row_begin / a.unit_rows + 1;
  const int64_t units = int64_t(a.num_kv_heads) * (a.group / a.unit_heads) * per_head;
  MSA_CHECK(units < INT_MAX, "combine: too many work units");
  const int64_t grid = std::min<int64_t>(units, int64_t(kCombineCtasPerSm) * num_sms);
  auto go = [&]<typename OutElem, bool kSpec>() {
    const dim3 g{unsigned(grid)}, b{unsigned(kCombineWarps * 32)};
    switch (a.part_kind) {
      case StoreKind::kF32: combine_kernel<OutElem, StoreKind::kF32, kSpec><<<g, b, 0, stream>>>(a); break;
      case StoreKind::kBF16: combine_kernel<OutElem, StoreKind::kBF16, kSpec><<<g, b, 0, stream>>>(a); break;
      case StoreKind::kF16: combine_kernel<OutElem, StoreKind::kF16, kSpec><<<g, b, 0, stream>>>(a); break;
      case StoreKind::kFP8: combine_kernel<OutElem, StoreKind::kFP8, kSpec><<<g, b, 0, stream>>>(a); break;
    }
  };
  auto by_spec = [&]<typename OutElem>() {
    if (a.all_slots_written) {
      go.template operator()<OutElem, true>();
    } else {
      go.template operator()<OutElem, false>();
    }
  };
  if (out_dtype == DType::kBF16) {
    by_spec.template operator()<__nv_bfloat16>();
  } else {
    by_spec.template operator()<__half>();
  }
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn
