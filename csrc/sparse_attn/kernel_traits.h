// Host- and device-visible types of the sparse-attention kernels: the KV storage kinds, the argument
// structs each kernel receives by value (__grid_constant__), and the fixed tile geometry.
// docs/design/sparse_attention.md explains the schedules and the numbers chosen here.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashmsa/params.h"
#include "flashmsa/types.h"

namespace flashmsa::sparse_attn {

// How K/V are stored relative to the compute dtype (bf16 or fp16, taken from q).
enum class KvKind : int { kNative = 0, kFp8 = 1, kNvfp4 = 2 };

// Element type of the partial outputs of the split schedules (PartialDType without kDefault).
enum class StoreKind : int { kF32 = 0, kBF16 = 1, kF16 = 2, kFP8 = 3 };

inline constexpr int store_kind_bytes(StoreKind k) {
  return k == StoreKind::kF32 ? 4 : (k == StoreKind::kFP8 ? 1 : 2);
}

// ---- query-major schedule ----------------------------------------------------------------------
// Work item = (query row r, kv head kh, row tile of the G heads, split of r's used blocks). One CTA
// of 4 warps holds the item's query heads (16 * kWarpsM rows) and streams the item's KV tiles of
// 64 keys through a cp.async pipeline; a warp owns 16 rows and 64 / kWarpsN keys of each tile.
inline constexpr int kQmThreads = 128;
inline constexpr int kQmTileKeys = 64;
inline constexpr int kQmMaxTiles = 2 * kMaxTopk;  // a block is at most two 64-key tiles

struct QueryMajorArgs {
  SparseAttnParams p;
  int group;          // G = Hq / Hkv
  int row_tiles;      // ceil(G / rows per CTA)
  int splits;         // chunks of each row's used blocks (1 when fused)
  bool write_final;   // true: out / lse directly (fused); false: partials for the combine
  bool q_fp8;         // q is fp8 e4m3 (decode): converted to bf16 on load
  bool has_temp;      // temperature LSE requested
  float scale_log2;   // effective softmax scale * log2(e)
  int64_t num_items;  // total_q * Hkv * row_tiles * splits
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

struct KvMajorItem {
  int kh;
  int b;
  int t;      // batch-local block
  int start;  // first list entry
  int count;  // tokens
  int pad[3];
};

// Control words of one KV-major launch group.
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
  const float* part_lse;
  const float* part_lse_t;
  void* out;       // [total_q, Hq, 128]
  float* lse;      // [total_q, Hq] natural log, or nullptr
  float* lse_t;    // or nullptr
  float v_scale;
};

}  // namespace flashmsa::sparse_attn
