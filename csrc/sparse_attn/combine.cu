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
#include <type_traits>

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
// kTilePartial's rows (with partial tiles most slots of a row are -inf, so a row's values are few
// and its two dependent round trips, LSEs then values, left the combine latency-bound: H200 at
// 614818c, 128K pipeline selections with tile_partial=3, 9.84 ms for ~60 % of the default's
// bytes) run as a software pipeline over the warp's rows of a unit: the next row's slot LSEs are
// loaded before the current row's values. The same merge_row and arithmetic.
struct CombineRowRef {
  int64_t base;     // slot 0 of the row's partials (part index)
  int64_t out_idx;  // row * Hq + head
  int tile_slot;    // TilePartialSlots::tile_slot, -1: none
};

template <StoreKind kKind>
struct PrefetchedLse {  // merge_row asks for lse(lane) and lse(lane + 32) only
  TilePartialSlots<kKind> s;
  float v0, v1;
  MSA_DEVICE float lse(int i) const { return i < 32 ? v0 : v1; }
  MSA_DEVICE float lse_t(int i) const { return s.lse_t(i); }
  MSA_DEVICE Raw8 load(int i, int hl) const { return s.load(i, hl); }
};

template <typename OutElem, StoreKind kKind>
MSA_DEVICE void combine_unit_pipelined(const CombineArgs& a, int kh, int g0, int r_begin, int n, bool tile_partial,
                                       int warp, int lane) {
  auto ref = [&](int i) {
    const int e = i / a.unit_heads;
    const int rel = r_begin - a.row_begin + e, g = g0 + i - e * a.unit_heads;
    CombineRowRef r;
    r.base = (int64_t(kh) * a.row_stride + rel) * a.num_slots * a.group + g;
    r.out_idx = (int64_t(a.row_begin) + rel) * a.num_heads + kh * a.group + g;
    r.tile_slot = -1;
    if (tile_partial) {
      const uint64_t m =
          a.union_entries[int64_t(kh) * a.union_num_tiles * a.union_tile_tokens + a.row_begin + rel];
      r.tile_slot = __ffsll(static_cast<long long>(m)) - 1;
    }
    return r;
  };
  auto slots = [&](const CombineRowRef& r) {
    return TilePartialSlots<kKind>{WorkspaceSlots<kKind>{a, r.base, r.base * 128 + 8 * (lane & 15), int64_t(a.group) * 128},
                                   r.out_idx, r.tile_slot};
  };
  if (warp >= n) return;
  CombineRowRef cur = ref(warp);
  float c0 = lane < a.num_slots ? slots(cur).lse(lane) : neg_inf();
  float c1 = lane + 32 < a.num_slots ? slots(cur).lse(lane + 32) : neg_inf();
  for (int i = warp; i < n; i += kCombineWarps) {  // warp-uniform loop
    CombineRowRef next = cur;
    float n0 = neg_inf(), n1 = neg_inf();
    if (i + kCombineWarps < n) {
      next = ref(i + kCombineWarps);
      n0 = lane < a.num_slots ? slots(next).lse(lane) : neg_inf();
      n1 = lane + 32 < a.num_slots ? slots(next).lse(lane + 32) : neg_inf();
    }
    merge_row<OutElem, kKind, PrefetchedLse<kKind>, false>(PrefetchedLse<kKind>{slots(cur), c0, c1}, a.num_slots,
                                                           a.v_scale, a.out, a.lse, a.lse_t, cur.out_idx, lane);
    cur = next;
    c0 = n0;
    c1 = n1;
  }
}

// kSpec (CombineArgs::all_slots_written, the decode combine) is a template parameter rather than a
// branch in one kernel: the speculative first batch needs 32 more registers, and with both paths in
// one kernel the KV-major combine paid them too (117-123 registers for 16-bit partials, 2 CTAs of 8
// warps per SM; 80 without, 3 CTAs; f32 partials, 118, would spill at 3).
// kTilePartial (CombineArgs::tile_lse, plan option tile_partial): rows of partial tiles merge the
// tile's partial too; a separate instantiation, so that the default one keeps its registers.
template <typename OutElem, StoreKind kKind, bool kSpec, bool kTilePartial = false>
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
    const uint8_t done = a.union_done != nullptr ? a.union_done[int64_t(kh) * a.union_num_tiles + tile] : 0;
    if (done == kTileDoneFull) continue;
    const bool tile_partial = kTilePartial && done == kTileDonePartial;
    const int r_begin = max(tile * t, a.row_begin);
    const int r_end = min((tile + 1) * t, a.row_begin + a.rows);
    const int n = (r_end - r_begin) * a.unit_heads;
    if constexpr (kTilePartial && !kSpec) {
      combine_unit_pipelined<OutElem, kKind>(a, kh, g0, r_begin, n, tile_partial, warp, lane);
      continue;
    }
    for (int i = warp; i < n; i += kCombineWarps) {  // warp-uniform loop
      const int e = i / a.unit_heads;
      const int rel = r_begin - a.row_begin + e, g = g0 + i - e * a.unit_heads;
      const int64_t base = (int64_t(kh) * a.row_stride + rel) * a.num_slots * a.group + g;
      const int64_t out_idx = (int64_t(a.row_begin) + rel) * a.num_heads + kh * a.group + g;
      // A partial tile's token: its tile's partial takes the slot of the first entry the tile
      // computed (none: the tile computed nothing for it).
      int tile_slot = -1;
      if (tile_partial) {
        const int64_t row = int64_t(a.row_begin) + rel;
        const uint64_t m = a.union_entries[int64_t(kh) * a.union_num_tiles * a.union_tile_tokens + row];
        tile_slot = __ffsll(static_cast<long long>(m)) - 1;
      }
      combine_row<OutElem, kKind, kSpec, kTilePartial>(a, base, out_idx, lane, tile_slot);
    }
  }
}

}  // namespace

void launch_combine(const CombineArgs& args, DType out_dtype, cudaStream_t stream) {
  if (args.rows <= 0) return;
  MSA_CHECK(args.unit_rows == combine_unit_rows(args.group) &&
                (args.union_done == nullptr || args.union_tile_tokens == args.unit_rows),
            "combine: work units must be the shared-selection tiles");
  MSA_CHECK(args.tile_lse == nullptr ||
                (args.union_done != nullptr && args.union_entries != nullptr && !args.all_slots_written &&
                 args.part_kind == (out_dtype == DType::kBF16 ? StoreKind::kBF16 : StoreKind::kF16)),
            "combine: partial tiles need their entry masks and 16-bit partials of the output dtype");
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
    if (a.tile_lse != nullptr) {  // 16-bit partials of the output's dtype (checked above)
      const dim3 g{unsigned(grid)}, b{unsigned(kCombineWarps * 32)};
      if constexpr (std::is_same_v<OutElem, __nv_bfloat16>) {
        combine_kernel<OutElem, StoreKind::kBF16, false, true><<<g, b, 0, stream>>>(a);
      } else {
        combine_kernel<OutElem, StoreKind::kF16, false, true><<<g, b, 0, stream>>>(a);
      }
    } else if (a.all_slots_written) {
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
