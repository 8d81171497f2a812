// Device-side construction of the KV-major work lists (a counting sort of (row, q2k slot) pairs by
// (kv head, flat block)), run once per launch group of query rows (lists=per_group), or once for
// the launch groups of the whole call (lists=once: the same kernels over all rows, each group with
// its own counters, list, items and control, see KvMajorArgs::list_groups):
//   prepare      once per call, the call's first kernel: the flat block numbering (sequence b's
//                blocks are columns [base[b], base[b+1])), the per-(group, kv head, column)
//                counters cleared, and the shared-selection tiles' control words cleared;
//   count        histogram of the pairs with integer atomics (a CTA's pairs of one counter summed in
//                shared memory first, one global atomic per counter and CTA); slots that get no pair (list end,
//                duplicate, out-of-range id, invalid page, block the row cannot see, row of no
//                sequence) have their partial LSE set to -inf right here, so the combine kernel
//                can read every slot of a row;
//   scan         one CTA per group: list offsets (exclusive scan of the counts) and the items (runs
//                of at most tokens_per_item tokens of one list); clears the counts for the next
//                group;
//   scatter      writes each pair into its list at an atomically taken cursor position (a CTA takes
//                one run of positions per counter, its pairs ranked in shared memory).
// The order of the pairs inside a list depends on the atomics; the results do not (see kv_major.cuh).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/launch.h"

namespace flashmsa::sparse_attn {

namespace {

constexpr int kScanThreads = 1024;

// Exclusive scan of one value per thread over a 1024-thread CTA; returns the total in *total.
template <typename T>
__device__ T block_exclusive_scan(T v, T* s_warp, T* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T incl = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T up = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += up;
  }
  if (lane == 31) s_warp[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    T w = s_warp[lane];
    T wincl = w;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const T up = __shfl_up_sync(0xffffffffu, wincl, d);
      if (lane >= d) wincl += up;
    }
    s_warp[lane] = wincl - w;
    if (lane == 31) *total = wincl;
  }
  __syncthreads();
  const T out = s_warp[warp] + incl - v;
  __syncthreads();  // s_warp may be reused by the caller
  return out;
}

// The call's preparation in one launch: every CTA scans the sequences' block counts (the flat
// block numbering: sequence b's blocks are columns [base[b], base[b+1]), clamped to nb_bound),
// CTA 0 stores the bases, every CTA clears its share of the per-(group, kv head, column) counters,
// and CTA 0 clears `zero_words` (the shared-selection tiles' control words, which the union plan
// kernel launched next counts into).
__global__ void __launch_bounds__(kScanThreads) prepare_kernel(const __grid_constant__ KvMajorArgs a,
                                                                unsigned long long* zero_words, int num_zero_words) {
  __shared__ int64_t s_warp[32];
  __shared__ int64_t s_total;
  const int n = a.p.batch;
  const int seg = (n + kScanThreads - 1) / kScanThreads;
  const int begin = min(n, int(threadIdx.x) * seg), end = min(n, begin + seg);
  int64_t sum = 0;
  for (int b = begin; b < end; ++b) sum += num_blocks(kv_seqlen(a.p.kv, b));
  int64_t run = block_exclusive_scan<int64_t>(sum, s_warp, &s_total);
  // Columns past nb_bound (only malformed, overlapping flat sequences get there) are dropped by
  // the builder; clamping keeps every stored base a valid int.
  const int nb = int(s_total < a.nb_bound ? s_total : int64_t(a.nb_bound));
  if (blockIdx.x == 0) {
    for (int b = begin; b < end; ++b) {
      a.block_base[b] = int(run < a.nb_bound ? run : int64_t(a.nb_bound));
      run += num_blocks(kv_seqlen(a.p.kv, b));
    }
    if (threadIdx.x == 0) a.block_base[n] = nb;
    if (int(threadIdx.x) < num_zero_words) zero_words[threadIdx.x] = 0;
  }
  // (group, kv head) pairs: their counter rows are nb_bound apart.
  const int64_t total = int64_t(a.list_groups) * a.p.num_kv_heads * nb;
  for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < total;
       x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t gk = x / nb, col = x % nb;
    a.counts[gk * a.nb_bound + col] = 0;
  }
}

// What a row needs to classify its q2k entries.
struct RowContext {
  int b;
  int nb;
  int lim;   // col_limit of the row
  int base;  // first flat column of sequence b
};

__device__ bool row_context(const KvMajorArgs& a, int r, RowContext& c) {
  const SparseAttnParams& p = a.p;
  c.b = find_sequence(p, r);
  if (c.b < 0) return false;
  const int seqlen_k = kv_seqlen(p.kv, c.b);
  c.nb = num_blocks(seqlen_k);
  const RowRange rr = q_rows(p.qi, p.total_q, c.b);
  c.lim = col_limit(p.causal, q_offset_of(p.q_offset, c.b, rr.len, seqlen_k), r - rr.begin, seqlen_k);
  c.base = a.block_base[c.b];
  return true;
}

// Flat column of entry e of a row's list (value t, `used` as in q2k_entry_used) when it becomes a
// pair, else -1.
__device__ int entry_column(const KvMajorArgs& a, const RowContext& c, int t, bool used) {
  if (!used) return -1;
  if (int64_t(t) * kBlockSize >= c.lim) return -1;  // no visible key (t < nb follows from lim <= seqlen)
  if (a.p.kv.paged && kv_page(a.p.kv, c.b, t) < 0) return -1;
  const int64_t col = int64_t(c.base) + t;
  return col < a.nb_bound ? int(col) : -1;
}

// The pair kernels' per-CTA aggregation (one warp per (kv head, row), kPairWarpsPerCta rows per
// CTA): pairs of the CTA that go to the same counter (a (group, kv head, column)) are counted in a
// shared-memory table first and reach the global counter with one atomic per counter and CTA.
// Without it every pair was one global atomic, and the columns most rows select (the sink block,
// a run of rows' local block, the early blocks of uniform selections) serialized thousands of
// same-address atomics per launch group in L2 (the list kernels' time grew with the rows per
// group). A pair whose probe finds no free slot in kPairProbes steps takes its own global atomic.
constexpr int kPairWarpsPerCta = 32;
constexpr int kPairTableSlots = 1024;  // >= 2x the pairs of a CTA at topk <= 16
constexpr int kPairProbes = 8;
constexpr unsigned long long kPairEmpty = ~0ull;

// Slot of `key` in the table (inserted if absent), -1 when kPairProbes slots are taken by others.
__device__ int pair_table_slot(unsigned long long* keys, unsigned long long key) {
  uint32_t h = (uint32_t(key) ^ uint32_t(key >> 32)) * 0x9E3779B1u >> 22;  // 10 bits: kPairTableSlots
#pragma unroll 1
  for (int probe = 0; probe < kPairProbes; ++probe) {
    const unsigned long long prev = atomicCAS(&keys[h], kPairEmpty, key);
    if (prev == kPairEmpty || prev == key) return int(h);
    h = (h + 1) & (kPairTableSlots - 1);
  }
  return -1;
}

// -inf partial LSEs (part_lse, and part_lse_t when there is one) for the slots of entries whose
// bit of `fill` is set (bit e: entry e of the row made no pair), a warp's row at once: the row's
// topk x G LSEs are contiguous from `base`, so the warp stores them in order (16-byte stores where
// G is a multiple of 4 and the buffers are aligned; a row whose entries all made no pair, e.g. a
// row a shared-selection tile did, in topk x G / 128 stores for the warp). Per entry and lane
// instead, G scalar stores 4 x G bytes apart across the lanes cost a sector each (the count
// kernel's time at 8K, where the tiles take nearly every row).
__device__ void fill_no_pair_lse(const KvMajorArgs& a, int64_t base, int topk, uint64_t fill, int lane) {
  if (fill == 0u) return;
  const int G = a.group, n = topk * G;
  float* const lse = a.part_lse + base;
  float* const lse_t = a.part_lse_t != nullptr ? a.part_lse_t + base : nullptr;
  const bool vec = G % 4 == 0 && (reinterpret_cast<uintptr_t>(lse) & 15u) == 0 &&
                   (lse_t == nullptr || (reinterpret_cast<uintptr_t>(lse_t) & 15u) == 0);
  if (vec) {
    const float4 ninf = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    for (int i = lane; i < n / 4; i += 32) {
      if (((fill >> (4 * i / G)) & 1u) == 0u) continue;
      reinterpret_cast<float4*>(lse)[i] = ninf;
      if (lse_t != nullptr) reinterpret_cast<float4*>(lse_t)[i] = ninf;
    }
  } else {
    for (int i = lane; i < n; i += 32) {
      if (((fill >> (i / G)) & 1u) == 0u) continue;
      lse[i] = -INFINITY;
      if (lse_t != nullptr) lse_t[i] = -INFINITY;
    }
  }
}

// One warp per (kv head, row of the launch). kScatter = false: count; true: scatter.
template <bool kScatter>
__global__ void __launch_bounds__(kPairWarpsPerCta * 32, 2) pair_kernel(const __grid_constant__ KvMajorArgs a) {
  static_assert(kPairTableSlots == 1 << 10, "pair_table_slot's hash takes 10 bits");
  __shared__ unsigned long long s_key[kPairTableSlots];
  __shared__ int s_count[kPairTableSlots];
  __shared__ int s_base[kScatter ? kPairTableSlots : 1];
  for (int i = threadIdx.x; i < kPairTableSlots; i += blockDim.x) {
    s_key[i] = kPairEmpty;
    s_count[i] = 0;
  }
  __syncthreads();
  const SparseAttnParams& p = a.p;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  int slot[2] = {-1, -1}, rank[2] = {0, 0};
  uint32_t entry[2] = {0u, 0u};
  int64_t list0 = 0;
  if (w < int64_t(p.num_kv_heads) * a.rows) {  // warp-uniform; no return: the CTA syncs below
    const int kh = int(w / a.rows), lr = int(w % a.rows);
    const int r = a.row_begin + lr;
    const int j = lr / a.chunk_rows, rel = lr - j * a.chunk_rows;  // launch group, row in it
    // Rows of a shared-selection tile are done already; the combine skips them too. lists=once:
    // the first group's rows set every slot of such a row to -inf (no later group's combine
    // resets them).
    const bool done =
        a.union_done != nullptr && a.union_done[int64_t(kh) * a.union_num_tiles + r / a.union_tile_tokens];
    if (!(done && (kScatter || !a.lists_once || j > 0))) {
      // lists=once: the -inf LSEs of the later groups' non-pair slots come from the combine's reset.
      const bool mark = j == 0;
      const int* list = q2k_row(p, kh, r);
      RowContext c;
      const bool covered = !done && row_context(a, r, c);
      const WarpQ2k wl = warp_q2k_list(list, p.topk, covered ? c.nb : 0, lane);
      const int64_t counter0 = (int64_t(j) * p.num_kv_heads + kh) * a.nb_bound;
      list0 = int64_t(j) * p.num_kv_heads * a.chunk_rows * p.topk;
      bool no_pair[2] = {false, false};
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int e = lane + 32 * k;
        if (e >= p.topk) break;
        const int col = covered ? entry_column(a, c, wl.v[k], wl.used[k]) : -1;
        const int64_t counter = counter0 + col;
        entry[k] = (uint32_t(rel) << 6) | uint32_t(e);
        no_pair[k] = col < 0;
        if (col >= 0) {
          slot[k] = pair_table_slot(s_key, (unsigned long long)counter);
          if (slot[k] >= 0) {
            rank[k] = atomicAdd(&s_count[slot[k]], 1);
          } else if constexpr (!kScatter) {
            atomicAdd(&a.counts[counter], 1);
          } else {
            a.list[list0 + atomicAdd(&a.cursors[counter], 1)] = entry[k];
          }
        }
      }
      if (!kScatter && mark) {
        const uint64_t fill = uint64_t(__ballot_sync(0xffffffffu, no_pair[0])) |
                              uint64_t(__ballot_sync(0xffffffffu, no_pair[1])) << 32;
        fill_no_pair_lse(a, (int64_t(kh) * a.chunk_rows + rel) * p.topk * a.group, p.topk, fill, lane);
      }
    }
  }
  __syncthreads();
  // One global atomic per counter the CTA's pairs reached (scatter: the base of its run).
  for (int i = threadIdx.x; i < kPairTableSlots; i += blockDim.x) {
    const int n = s_count[i];
    if (n == 0) continue;
    if constexpr (!kScatter) {
      atomicAdd(&a.counts[s_key[i]], n);
    } else {
      s_base[i] = atomicAdd(&a.cursors[s_key[i]], n);
    }
  }
  if constexpr (kScatter) {
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (slot[k] >= 0) a.list[list0 + s_base[slot[k]] + rank[k]] = entry[k];
  }
}

// One CTA per launch group of the list launch (blockIdx.x: the group).
__global__ void __launch_bounds__(kScanThreads) scan_kernel(const __grid_constant__ KvMajorArgs a) {
  __shared__ int64_t s_warp[32];
  __shared__ int64_t s_total_pairs, s_total_items;
  const int nb = a.block_base[a.p.batch];
  const int64_t n = int64_t(a.p.num_kv_heads) * nb;
  const int64_t seg = (n + kScanThreads - 1) / kScanThreads;
  const int64_t begin = min(n, int64_t(threadIdx.x) * seg), end = min(n, begin + seg);
  const int tpi = a.tokens_per_item;
  const int64_t group_counters = int64_t(blockIdx.x) * a.p.num_kv_heads * a.nb_bound;
  KvMajorItem* const group_items = a.items + int64_t(blockIdx.x) * a.max_items;
  KvMajorControl* const control = a.control + blockIdx.x;
  auto counter = [&](int64_t x) { return group_counters + (x / nb) * a.nb_bound + x % nb; };
  int64_t pairs = 0, items = 0;
  for (int64_t x = begin; x < end; ++x) {
    const int cnt = a.counts[counter(x)];
    pairs += cnt;
    items += (cnt + tpi - 1) / tpi;
  }
  int64_t off = block_exclusive_scan<int64_t>(pairs, s_warp, &s_total_pairs);
  int64_t io = block_exclusive_scan<int64_t>(items, s_warp, &s_total_items);
  for (int64_t x = begin; x < end; ++x) {
    const int64_t idx = counter(x);
    const int cnt = a.counts[idx];
    a.counts[idx] = 0;  // ready for the next launch group
    a.cursors[idx] = int(off);
    if (cnt > 0) {
      const int kh = int(x / nb), col = int(x % nb);
      // Sequence of the column: the last b with base[b] <= col (empty sequences share a base).
      int lo = 0, hi = a.p.batch - 1, b = 0;
      while (lo <= hi) {
        const int mid = (lo + hi) >> 1;
        if (a.block_base[mid] <= col) {
          b = mid;
          lo = mid + 1;
        } else {
          hi = mid - 1;
        }
      }
      const int seqlen_k = kv_seqlen(a.p.kv, b);
      const RowRange rr = q_rows(a.p.qi, a.p.total_q, b);
      const int q_off = int(q_offset_of(a.p.q_offset, b, rr.len, seqlen_k));
      for (int j = 0; j * tpi < cnt; ++j, ++io) {
        if (io >= a.max_items) continue;  // cannot happen: max_items bounds the sum (see launcher)
        KvMajorItem it{};
        it.kh = kh;
        it.b = b;
        it.t = col - a.block_base[b];
        it.start = int(off) + j * tpi;
        it.count = min(tpi, cnt - j * tpi);
        it.seqlen_k = seqlen_k;
        it.q_begin = rr.begin;
        it.q_off = q_off;
        group_items[io] = it;
      }
    }
    off += cnt;
  }
  if (threadIdx.x == 0) {
    control->num_items = int(min(s_total_items, int64_t(a.max_items)));
    control->next_item = 0;
  }
}

}  // namespace

void launch_kv_major_prepare(const KvMajorArgs& a, int num_sms, void* zero_words, int zero_bytes,
                             cudaStream_t stream) {
  MSA_CHECK(zero_bytes >= 0 && zero_bytes % 8 == 0 && zero_bytes / 8 <= kScanThreads &&
                reinterpret_cast<uintptr_t>(zero_words) % 8 == 0,
            "msa_sparse_attention: control words to clear out of range (planner bug)");
  prepare_kernel<<<unsigned(std::max(1, num_sms / 2)), kScanThreads, 0, stream>>>(
      a, static_cast<unsigned long long*>(zero_words), zero_bytes / 8);
  MSA_CUDA_CHECK(cudaGetLastError());
}

void launch_kv_major_lists(const KvMajorArgs& a, cudaStream_t stream) {
  const int64_t warps = int64_t(a.p.num_kv_heads) * a.rows;
  const int64_t grid = (warps + kPairWarpsPerCta - 1) / kPairWarpsPerCta;
  MSA_CHECK(grid <= INT_MAX, "msa_sparse_attention: too many query rows in one launch group");
  MSA_CHECK(a.list_groups >= 1 && int64_t(a.list_groups) * a.chunk_rows >= a.rows,
            "msa_sparse_attention: list launch groups do not cover its rows (planner bug)");
  pair_kernel<false><<<unsigned(grid), kPairWarpsPerCta * 32, 0, stream>>>(a);
  MSA_CUDA_CHECK(cudaGetLastError());
  scan_kernel<<<unsigned(a.list_groups), kScanThreads, 0, stream>>>(a);
  MSA_CUDA_CHECK(cudaGetLastError());
  pair_kernel<true><<<unsigned(grid), kPairWarpsPerCta * 32, 0, stream>>>(a);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn
