// Host- and device-visible types of the sparse-attention kernels: the KV storage kinds, the argument
// structs each kernel receives by value (__grid_constant__), and the fixed tile geometry.
// docs/design/sparse_attention.md explains the schedules and the numbers chosen here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashmsa/params.h"
#include "flashmsa/plan.h"
#include "flashmsa/types.h"

namespace flashmsa::sparse_attn {

// How K/V are stored relative to the compute dtype (bf16 or fp16, taken from q).
enum class KvKind : int { kNative = 0, kFp8 = 1, kNvfp4 = 2 };

// Element type of the partial outputs of the split schedules (PartialDType without kDefault).
using ::flashmsa::StoreKind;
using ::flashmsa::store_kind_bytes;

// ---- query-major schedule ----------------------------------------------------------------------
// Work item = (query row r, kv head kh, row tile of the G heads, split of r's used blocks). One CTA
// of 4 warps holds the item's query heads (16 * kWarpsM rows) and streams the item's KV tiles of
// 64 keys through a cp.async pipeline; a warp owns 16 rows and 64 / kWarpsN keys of each tile.
inline constexpr int kQmThreads = 128;
inline constexpr int kQmTileKeys = 64;
inline constexpr int kQmMaxTiles = 2 * kMaxTopk;  // a block is at most two 64-key tiles
// split_warps=8 (query_major_wide.cuh): 8 warps share each 128-key block, 16 keys each; 2 CTAs
// per SM (its ~74 KB of shared memory would allow 3, its registers 2).
inline constexpr int kQmWideThreads = 256;
inline constexpr int kQmWideCtasPerSm = 2;
// split=cluster on 8 warps (query_major_wide.cuh, kCluster): the dynamic shared memory the cluster
// kernel is launched with, more than half an SM's 228 KB, so that each CTA of a cluster gets an SM
// of its own (as the plain grid's CTAs do at batch 1) instead of the cluster packing 2 or 3 CTAs,
// and their chains, onto one SM; its split count is planned for 1 CTA per SM.
inline constexpr int kQmWideClusterSmemBytes = 116 * 1024;
inline constexpr int kQmWideClusterCtasPerSm = 1;

// Shared memory of the streaming decode variant (query_major.cuh: 3 stages of 32 KB, raw 128-key fp8
// K and V blocks (kv_regs.cuh) or 64-key bf16 / fp16 K and V tiles, plus Q, plan and list): more
// than the 99 KB a CTA may use on sm_86 / sm_89, where the shared-memory kernel runs instead.
inline constexpr int kQmRegsSmemBytes = 105 * 1024;

struct QueryMajorArgs {
  SparseAttnParams p;
  int group;          // G = Hq / Hkv
  int row_tiles;      // ceil(G / rows per CTA)
  int splits;         // chunks of each row's used blocks (1 when fused)
  bool write_final;   // true: out / lse directly (fused); false: partials for the combine
  bool q_fp8;         // q is fp8 e4m3 (decode): converted to bf16 on load
  bool has_temp;      // temperature LSE requested
  float scale_log2;   // effective softmax scale * log2(e)
  int64_t num_items;  // total_q * Hkv * row_tiles * splits (MTP union: batch * Hkv * splits)
  // MTP union items (decode, uniform seqlen_q = mtp_tokens in 2..4, tokens x G <= 64 rows,
  // tokens x topk <= 64 entries): an item is (request, kv head, split) over the union of the
  // request's selections; 0: items are (row, kv head, row tile, split).
  int mtp_tokens;
  // Partials (write_final == false): slot (kh, r, split, g) at ((kh * total_q + r) * splits + split) * G + g.
  void* part_o;          // [Hkv, total_q, splits, G, 128] of part_kind
  StoreKind part_kind;
  float* part_lse;       // [Hkv, total_q, splits, G] log2-domain LSE of the slot, -inf when empty
  float* part_lse_t;     // same for the temperature LSE, or nullptr
};

// ---- KV-major schedule -------------------------------------------------------------------------
// Work item = (kv head, sequence, block, a run of at most kKvmMaxRowsPerItem / G of the tokens that
// selected the block). A CTA loads the 128-key block once and its warps stream 32-row query tiles
// (rows = (token, head) pairs) through it, writing one partial per (token, kv head, q2k slot).
inline constexpr int kKvmMaxThreads = 256;
inline constexpr int kKvmWarpRows = 32;
inline constexpr int kKvmMaxRowsPerItem = 4096;
// The sm_90a kernel keeps an item's list in shared memory: at most this many tokens per item.
inline constexpr int kKvm90MaxTokensPerItem = 1024;
// The TMA kernel (kv_major_kernel=tma) keeps two items' lists next to two K/V blocks, a 4-stage
// query ring and two staging tiles: at most this many tokens per item (4096 / G for G = 16).
inline constexpr int kKvmTmaMaxTokensPerItem = 256;

// One item of a KV-major launch group, as the scan kernel writes it: what the attention kernels'
// item start needs, without further reads of the sequence tables.
struct KvMajorItem {
  int kh;
  int b;
  int t;         // batch-local block
  int start;     // first list entry
  int count;     // tokens
  int seqlen_k;  // of sequence b
  int q_begin;   // first query row of sequence b
  int q_off;     // q_offset_of(b): an int32 offset or seqlen_k - seqlen_q, so it fits
};
static_assert(sizeof(KvMajorItem) == 32, "one 32-byte record per item");

// Control words of one KV-major launch group (lists=once: one per group, [groups]).
struct KvMajorControl {
  int num_items;
  int next_item;  // work counter of the persistent attention kernel
};

struct KvMajorArgs {
  SparseAttnParams p;
  int group;
  bool has_temp;
  float scale_log2;
  int row_begin;   // first query row of this launch group
  int rows;        // rows in this launch group
  int chunk_rows;  // row dimension of the partial layout (>= rows)
  int nb_bound;    // columns of the per-kv-head block arrays
  int tokens_per_item;
  int max_items;
  int num_warps;   // 4 or 8 warps per CTA
  int q_stages;    // 1 or 2 query-tile buffers per warp
  int* block_base;            // [B + 1] first flat column of each sequence, [B] = total
  int* counts;                // [Hkv, nb_bound]
  int* cursors;               // [Hkv, nb_bound] list offsets, then scatter cursors
  KvMajorControl* control;
  KvMajorItem* items;         // [max_items]
  uint32_t* list;             // [Hkv * rows * topk] entries (row - row_begin) << 6 | slot
  void* part_o;               // [Hkv, chunk_rows, topk, G, 128] compute dtype
  float* part_lse;            // [Hkv, chunk_rows, topk, G]
  float* part_lse_t;          // same or nullptr
  const uint8_t* union_done;  // [Hkv, ceil(total_q / union_tile_tokens)] rows done by the
  int union_tile_tokens;      // shared-selection tiles (skipped here), or nullptr
  int union_num_tiles;
  // List building only (kv_major_lists.cu; appended so the attention kernels' parameter offsets
  // stay those of the per-group layout). The rows [row_begin, row_begin + rows) of one list launch
  // span list_groups launch groups of chunk_rows rows: 1 with lists=per_group, every group of the
  // call with lists=once. Group j of the launch has its own counts / cursors (+ j * Hkv *
  // nb_bound), control (+ j), items (+ j * max_items) and list (+ j * Hkv * chunk_rows * topk);
  // the attention kernel of a group gets those pointers already offset, so it never sees j.
  int list_groups;
  // lists=once: the non-pair slots' -inf partial LSEs are written for the first group only (every
  // slot of its union_done rows included); the combine of each group resets the slots it read to
  // -inf (CombineArgs::reset_lse), which keeps the invariant for the next group.
  bool lists_once;
  // The sm_90a kernel's per-row log2 (partial LSEs) and 1 / l by MUFU approximations instead of the
  // correctly rounded forms (plan option kv_major_math=approx; KvMajorPlan::approx_math).
  bool approx_row_math;
};

// ---- shared-selection tiles (sm_90a, prefill) ---------------------------------------------------
// Where neighbouring tokens select nearly the same blocks ("clustered", docs/benchmarks.md), a
// tile of 128 / G consecutive tokens (128 query rows of one kv head) walks the union of its tokens'
// blocks once, K/V shared by all rows, each row masked to the blocks its token selected, and
// writes final outputs: no partials. A tile qualifies when that wastes at most a bound times the
// useful work (computed (token, block) products <= bound x pairs; each of the kernel's two 64-row halves
// computes the blocks its own tokens selected, so that is (u0 + u1) x tokens / 2 for the unions
// u0 / u1 of the halves, union blocks x tokens before): measured on an H200 (M3, 32K), a computed
// (token, block) cost ~3.1 ns in the first (lock-step) tile kernel and a pair ~5.0 ns the KV-major
// way (kernel, combine, lists), so the break-even was ~1.6; the warp-specialized kernel brought the
// first figure to ~2.4 ns (break-even ~2.1; the cp.async kernel kept 1.5). The others go the
// KV-major way, whose list builder and combine skip the rows done here (done flags).
// The TMA tile kernel (~513 useful TFLOP/s at waste 1 against ~400 for the cp.async one) moved the
// break-even up, and every cheaper path since moved it again (the KV-major combine and list
// kernels down for large calls; the tile kernels' skipped softmax of warps whose token did not
// select a block, b679588, up). Measured last on an H200 at a60079e (kernels per M3 call, the bound
// forced, both synthetic selection kinds; every sweep: docs/design/sparse_attention.md#tile-waste):
// 3.0 beats 2.0 at 8K on random and pipeline selections (1.624 vs 1.692 ms, 1.368 vs 1.439); from
// 12K to 40K it wins on pipeline selections (3-6 %) but loses on random ones (12K 3.025 vs 2.670,
// 16K 4.208 vs 3.768, 32K 8.386 vs 7.878: 7-13 %); from 48K 2.0 wins on both (128K 46.44 vs 56.00
// on pipeline ones). So the TMA tiles take 3.0 up to kUnionSmallRows (8192) rows, else 2.0 (the
// bound that loses least on either kind); the cp.async tiles keep 1.5 (not re-measured).
// The plan option tile_max_waste=<x> (a tuning knob, 1 <= x <= 8) replaces any of them.
inline constexpr int kUnionRows = 128;
inline constexpr int kUnionMaxWasteMilli = 1500;       // the 1.5 (cp.async tiles), in thousandths
inline constexpr int kUnionMaxWasteMilliTma = 2000;    // the 2.0 (TMA tiles)
inline constexpr int kUnionMaxWasteMilliSmall = 3000;  // the 3.0 (TMA tiles, small calls)
inline constexpr int64_t kUnionSmallRows = 8192;
// tile_bound=adaptive: the wide bound is taken when the tiles within it hold at least this share of
// the pairs (x 1000): on the H200's sweeps 3.0 won where it left the KV-major kernel ~0.5 % of its
// time at 2.0 (nearly every pair in tiles: pipeline selections, 12K to 40K rows) and lost where it
// left it ~70 % (random ones).
inline constexpr int kUnionWideShareMilli = 970;
// tile_bound=auto takes adaptive with the TMA tiles' default bound from kUnionSmallRows + 1 up to
// this many rows. H200 at b5b8409 (kernels per M3 call, default 2.0 / adaptive): pipeline
// selections 16K 3.669 / 3.393 ms, 32K 8.184 / 8.090, 48K 14.137 / 14.351 (3.0 itself loses there:
// 13.72 vs 14.31 at 7dc3328, while at 40K it still won, 10.68 vs 10.82); random ones 16K 3.770 /
// 3.792, 32K 7.900 / 7.948 (the counting and the second kernel, ~0.03-0.05 ms; the decision
// itself stays at 2.0 there).
inline constexpr int64_t kUnionAdaptiveRows = 40960;
inline constexpr int kUnionMaxTokens = 8;  // G >= 16 (and 128 % G == 0): token masks fit a byte
// The tile kernel's plan buffers hold this many union blocks (the planner checks it): 1.5 x 64, the
// most a tile of topk 64 could have under the default whole-union criterion.
inline constexpr int kUnionMaxBlocks = 96;

// UnionArgs::control: two int counters, then two 64-bit pair counts (cleared before the plan
// kernel runs: by the KV-major preparation kernel, launch.h).
inline constexpr int kUnionControlBytes = 2 * 4 + 2 * 8;

struct UnionArgs {
  SparseAttnParams p;
  int group;
  int tile_tokens;  // 128 / G
  int num_tiles;    // ceil(total_q / tile_tokens)
  int max_entries;  // tile_tokens * topk: the plan capacity of one tile
  int max_waste_milli;  // qualifying: computed (token, block) products x 1000 <= this x pairs
  // > 0 (tile_bound=adaptive): tiles within this bound qualify too when they hold at least
  // kUnionWideShareMilli / 1000 of the call's pairs (union_plan.cu's second pass decides)
  int wide_waste_milli;
  bool has_temp;
  float scale_log2;
  uint8_t* done;         // [Hkv, num_tiles] 1: the tile's rows of this kv head are computed here
  int* plan_count;       // [Hkv, num_tiles] union size of a qualifying tile
  int* plan_block;       // [Hkv, num_tiles, max_entries] union blocks, ascending
  uint8_t* plan_mask;    // [Hkv, num_tiles, max_entries] tokens of the tile that selected each
  int* work;             // [Hkv * num_tiles] qualifying (kh * num_tiles + tile)
  int* control;          // [0] qualifying tiles, [1] work counter of the attention kernel, [2] / [3]
                         // (wide_waste_milli > 0) pairs of all tiles / of the tiles within the wide bound
};

// ---- combine -----------------------------------------------------------------------------------
// out[r, hq] = v_global_scale * sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max_s lse_s) over
// the slots of (kh, r); slot s of head g at ((kh * row_stride + r - row_begin) * num_slots + s) * G + g.
struct CombineArgs {
  int row_begin;
  int rows;
  int row_stride;
  int num_heads;
  int num_kv_heads;
  int group;
  int num_slots;
  const void* part_o;
  StoreKind part_kind;
  float* part_lse;    // written only with reset_lse
  float* part_lse_t;
  void* out;       // [total_q, Hq, 128]
  float* lse;      // [total_q, Hq] natural log, or nullptr
  float* lse_t;    // or nullptr
  float v_scale;
  const uint8_t* union_done;  // rows done by shared-selection tiles are skipped (or nullptr)
  int union_tile_tokens;
  int union_num_tiles;
  int unit_rows;  // rows of one work unit: combine_unit_rows(group)
  int unit_heads;  // heads of one work unit (a divisor of group; the launcher's choice, 0: group)
  // KV-major lists=once: each slot read with a finite (or NaN) LSE is set back to -inf (both LSE
  // arrays), so the next launch group finds every slot it does not write at -inf.
  bool reset_lse;
  // The attention kernel wrote every slot's values (zeros where its LSE is -inf: the query-major
  // split-K kernels), so the combine may load them before it knows the weights (combine.cuh
  // merge_row, kSpec). False for KV-major, whose non-pair slots are never written.
  bool all_slots_written;
};

// Rows of a combine work unit: about 128 (row, head) pairs, and for G in {16, 32, 64, 128} exactly
// a shared-selection tile (kUnionRows / G tokens).
inline constexpr int combine_unit_rows(int group) { return group >= kUnionRows ? 1 : kUnionRows / group; }

// Rows of a combine work unit as launched. With shared-selection tiles to skip (union_done) the
// units are the tiles; without, a unit may be any run of rows, and calls of few rows (decode: B
// tokens, a unit of 128 (row, head) pairs per kv head left B8 / M3 on 4 CTAs whose warps merged
// 16 rows each in turn, ~20 us) get shorter units, down to one row, so that there are about
// 2 units per SM.
inline int combine_launch_unit_rows(const CombineArgs& a, int num_sms) {
  if (a.union_done != nullptr) return a.unit_rows;
  const int64_t want_per_head = (2 * int64_t(num_sms) + a.num_kv_heads - 1) / a.num_kv_heads;
  const int64_t rows = a.rows / want_per_head;
  return int(rows < 1 ? 1 : rows < a.unit_rows ? rows : a.unit_rows);
}

// Heads of a combine work unit as launched, for units of unit_rows rows: all G of the kv head, or
// where there are still fewer units than SMs (the smallest decode batches: B1 / M3 is 4 units of 16
// (row, head) pairs, two in turn per warp of 8), halves of them down to one pair per warp (8 heads:
// B1 runs 8 units).
inline int combine_launch_unit_heads(const CombineArgs& a, int unit_rows, int num_sms, int warps) {
  if (a.union_done != nullptr) return a.group;
  const int64_t units = int64_t(a.num_kv_heads) * ((a.rows + unit_rows - 1) / unit_rows);
  int heads = a.group;
  while (heads % 2 == 0 && int64_t(unit_rows) * heads > warps && units * (a.group / heads) * 2 <= num_sms) heads /= 2;
  return heads;
}

}  // namespace flashmsa::sparse_attn
