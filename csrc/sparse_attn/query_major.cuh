// Query-major sparse attention (decode, MTP, small prefills, and the fallback prefill schedule).
//
// Work item = (query row r, kv head kh, row tile rt of the G heads, split s). Warp 0 plans the
// item: it reads r's q2k list (D5 set semantics through semantics.h), keeps the used, visible,
// valid-page blocks in list order, takes split s's share of them and cuts each block into <= 2
// tiles of 64 keys holding only the keys the row can see (all heads of a token share one causal
// limit, so no key is loaded that every row would mask). The 4 warps then stream those tiles
// through a kStages-deep cp.async pipeline; warp (w_m, w_n) owns query rows 16 w_m .. + 16 and keys
// [w_n * 64 / kWarpsN, ...) of every tile, with its own online softmax. At the end the kWarpsN
// states of a row tile are merged through shared memory in a fixed order (deterministic) and the
// item writes either the final output / LSE (fused) or a partial for the combine kernel, or
// (split=cluster, kCluster below) keeps its partial in shared memory for its cluster to merge.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>

#include "common/cuda_utils.h"
#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/combine.cuh"
#include "sparse_attn/kv_regs.cuh"
#include "sparse_attn/kv_regs_tma.cuh"
#include "sparse_attn/launch.h"

namespace flashmsa::sparse_attn {

// kRegs: the streaming decode variant (decode plan option kernel=regs), 16-row tiles, 2 CTAs per SM:
// fp8 and NVFP4 K/V converted in registers from raw 128-key blocks (kv_regs.cuh); bf16 / fp16 K/V
// through the shared-memory path with 3 stages of 64-key tiles instead of 2.
// kRegs with kWarpsM = 4: MTP union items with fp8 K/V converted in registers (64-row tiles; the
// cooperative variant, kCoop). NVFP4 union items take the shared-memory union kernel (their
// register variant, each warp its 16 rows and all keys, measured slower on the H200 and removed).
template <typename Elem, KvKind kKv, int kWarpsM, bool kRegs = false>
struct QueryMajorConfig {
  static_assert(!kRegs || kWarpsM == 1 || kKv == KvKind::kFp8,
                "streaming variant: 16-row tiles, or 64-row MTP union tiles of fp8 K/V");
  static constexpr bool kRegConvert = kRegs && kKv != KvKind::kNative;  // kv_regs.cuh
  static constexpr bool kMtpRegs = kRegConvert && kWarpsM == 4;
  // The cooperative variant (kv_regs.cuh "MTP union items, cooperative"): the 4 warps split the
  // keys of Q K^T and the head dims of P V, so each conversion feeds the 4 m tiles.
  static constexpr bool kCoop = kMtpRegs;
  static constexpr int kWarps = kQmThreads / 32;
  static constexpr int kWarpsN = kWarps / kWarpsM;
  static constexpr int kRows = 16 * kWarpsM;          // query heads per CTA
  // Keys per tile: 64 (a block is one or two tiles); the register variant streams whole 128-key
  // blocks, so each warp's softmax step, tile issue and barrier cover 32 keys instead of 16.
  static constexpr int kTileKeys = kRegConvert ? 2 * kQmTileKeys : kQmTileKeys;
  static constexpr int kWarpKeys = kTileKeys / kWarpsN;
  static constexpr int kNT = kWarpKeys / 8;            // n8 key tiles per warp step
  // Raw stages are cheaper for quantized KV, so more of them are kept in flight, within the
  // 99 KB a CTA may use on every SM80+ GPU (sm_86 / sm_89 have the least).
  // The streaming variant: 3 stages of 32 KB (fp8: raw 128-key blocks, no compute tile; native:
  // 64-key K and V tiles), 2 in flight per CTA while one is computed, 2 CTAs per SM; NVFP4: 5
  // stages of 18 KB (raw 128-key blocks with their scales), 4 in flight.
  // MTP union in registers (fp8): a block is computed for 64 rows, ~2-4x as long as for 16, so one
  // block in flight covers the load: 2 stages of 32 KB (86 KB with the 16 KB Q tile: 2 CTAs per
  // SM, and within sm_86 / sm_89's 99 KB).
  static constexpr int kStages =
      kMtpRegs ? 2
      : kRegs  ? (kKv == KvKind::kNvfp4 ? 5 : 3)
               : (kKv == KvKind::kNative ? 2 : (kKv == KvKind::kFp8 ? (kWarpsM == 1 ? 3 : 2) : 4));
  static constexpr int kTileBytes = kQmTileKeys * 256;  // one K or V compute tile
  static constexpr int kStageBytes =
      kKv == KvKind::kNative ? 2 * kTileBytes : 2 * kRawTileBytes<kKv, kTileKeys>;
  static constexpr int kPipeBytes =
      kStages * kStageBytes + (kKv == KvKind::kNative || kRegs ? 0 : 2 * kTileBytes);
  // Merge: per warp with w_n > 0, 64 accumulators + (m, l, lt) x 2 rows per lane.
  static constexpr int kMergeFloats = 70;
  static constexpr int kMergeBytes = ((kWarpsN - 1) * kWarpsM * kMergeFloats * 32 * 4 + 1023) / 1024 * 1024;
  static constexpr int kStageOutBytes = 16 * 128 * 4;  // per warp, widest store kind
  static constexpr int kEpilogueBytes = kMergeBytes + kWarpsM * kStageOutBytes;
  static constexpr int kUnionBytes = kPipeBytes > kEpilogueBytes ? kPipeBytes : kEpilogueBytes;

  // Shared memory plan (byte offsets). Q and the tile list live outside the union because the
  // pipeline reads them until the last tile.
  static constexpr int kQOffset = 0;
  static constexpr int kTilesOffset = kQOffset + kRows * 256;
  static constexpr int kMiscOffset = kTilesOffset + kQmMaxTiles * int(sizeof(TileDesc));
  // kCoop: the step's row maxima of each warp, [64 rows][4 warps].
  static constexpr int kRowMaxOffset = kMiscOffset + 128;
  // regs_feed=tma (kv_regs_tma.cuh): each stage's full and empty mbarriers, in the misc words' upper half.
  static constexpr int kBarOffset = kMiscOffset + 64;
  static_assert(!(kRegConvert && kKv == KvKind::kFp8 && kWarpsM == 1) ||
                    (kMiscOffset % 8 == 0 && 2 * kStages * 8 <= 64),
                "the TMA feed's barriers in the misc words");
  static constexpr int kUnionOffset = (kRowMaxOffset + (kCoop ? 64 * 4 * 4 : 0) + 1023) / 1024 * 1024;
  static constexpr int kSmemBytes = kUnionOffset + kUnionBytes;
  // ldm_base_* fold the swizzle into an XOR, which needs 256-byte aligned tiles.
  static_assert(kUnionOffset % 256 == 0 && kStageBytes % 256 == 0, "256-byte aligned tiles");
  static_assert((kRegs && !kMtpRegs) || kSmemBytes <= 99 * 1024,
                "fits the smallest SM80+ shared memory (sm_86 / sm_89)");
  static_assert(!kRegs || kMtpRegs || kSmemBytes == kQmRegsSmemBytes ||
                    (kKv == KvKind::kNvfp4 && kSmemBytes <= kQmRegsSmemBytes),
                "the host's figure for the streaming variant");
  // MTP union in registers: each warp's fp16 Q fragments (4 KB, stash_q_frags) replace its own
  // 16 rows of the Q tile.
  static_assert(!kMtpRegs || kQOffset == 0 && kRows * 256 == kWarpsM * kQFragBytes, "Q fragments per warp");
  // kCoop: P ([64][128] fp16) over the raw K half of the block's stage; the per-warp sums of l and
  // lt ([2][64][4] floats) over the pipeline after the loop.
  static_assert(!kCoop || (kStageBytes / 2 == kRows * 256 && kPipeBytes >= 2 * 64 * 4 * 4), "kCoop buffers");
};

// Warp 0: builds the item's tile list in shared memory; returns the number of tiles (all lanes).
// kTileKeys = 64: a block is one or two tiles; 128: one tile per block. The row's q2k entries are
// read straight into registers (entry lane + 32 h: v[h]) before anything else, so that their load
// overlaps the sequence's; the list length and the repeats (semantics.h q2k_length and
// q2k_entry_used) come from ballots and __match_any_sync instead of per-lane loops over a shared
// copy, which were a serial chain of shared loads on the way to the first K / V copy.
// kTmaCoord (regs_feed=tma, one tile a block): each tile's TileDesc::pad holds the block's TMA
// coordinate (kv_regs_tma.cuh qm_tma_coord), 0 otherwise.
template <int kWarpsM, int kTileKeys = kQmTileKeys, bool kTmaCoord = false>
MSA_DEVICE int plan_query_major_item(const QueryMajorArgs& args, int r, int kh, int split,
                                     TileDesc* s_tiles, int lane) {
  const SparseAttnParams& p = args.p;
  const int* list = q2k_row(p, kh, r);
  int v[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) v[h] = lane + 32 * h < p.topk ? list[lane + 32 * h] : -1;
  const int b = find_sequence(p, r);
  if (b < 0) return 0;
  const int seqlen_k = kv_seqlen(p.kv, b);
  const int nb = num_blocks(seqlen_k);
  const RowRange rr = q_rows(p.qi, p.total_q, b);
  const int64_t q_off = q_offset_of(p.q_offset, b, rr.len, seqlen_k);
  const int lim = col_limit(p.causal, q_off, r - rr.begin, seqlen_k);

  // q2k_length: the first negative entry (entries past topk read as -1).
  const uint32_t neg0 = __ballot_sync(0xffffffffu, v[0] < 0);
  const uint32_t neg1 = __ballot_sync(0xffffffffu, v[1] < 0);
  const int len = neg0 != 0u ? __ffs(neg0) - 1 : (neg1 != 0u ? 32 + __ffs(neg1) - 1 : 64);
  // q2k_entry_used's repeats: an entry equal to an earlier one (every earlier entry of a used one
  // is before len, so non-negative: only the entries before len are ever asked about).
  const uint32_t lt_mask = (1u << lane) - 1u;
  bool rep[2];
  rep[0] = (__match_any_sync(0xffffffffu, v[0]) & lt_mask) != 0u;
  rep[1] = false;
  if (p.topk > 32) {  // uniform: entries 32.. against 0..31 and each other
    rep[1] = (__match_any_sync(0xffffffffu, v[1]) & lt_mask) != 0u;
#pragma unroll 8
    for (int j = 0; j < 32; ++j) {
      const int earlier = __shfl_sync(0xffffffffu, v[0], j);  // every lane takes part
      rep[1] = rep[1] || earlier == v[1];
    }
  }

  // Entries lane and lane + 32 (topk <= 64).
  bool used[2], two[2];
  int blk[2], vis[2];
  int64_t page[2] = {0, 0};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int e = lane + 32 * h;
    used[h] = e < len && v[h] < nb && !rep[h];
    blk[h] = used[h] ? v[h] : 0;
    const int64_t vis64 = int64_t(lim) - int64_t(blk[h]) * kBlockSize;
    vis[h] = used[h] ? int(vis64 < kBlockSize ? vis64 : int64_t(kBlockSize)) : 0;
    used[h] = used[h] && vis[h] > 0;
    if (used[h] && p.kv.paged) {
      page[h] = kv_page(p.kv, b, blk[h]);
      used[h] = page[h] >= 0;
    }
    two[h] = used[h] && vis[h] > kTileKeys;
  }
  const uint32_t u0 = __ballot_sync(0xffffffffu, used[0]);
  const uint32_t u1 = __ballot_sync(0xffffffffu, used[1]);
  const int n_used = __popc(u0) + __popc(u1);
  const int per_split = (n_used + args.splits - 1) / args.splits;
  const int s_begin = split * per_split;
  const int s_end = min(n_used, s_begin + per_split);
  bool keep[2];
  keep[0] = used[0] && __popc(u0 & lt_mask) >= s_begin && __popc(u0 & lt_mask) < s_end;
  const int rank1 = __popc(u0) + __popc(u1 & lt_mask);
  keep[1] = used[1] && rank1 >= s_begin && rank1 < s_end;
  const uint32_t k0 = __ballot_sync(0xffffffffu, keep[0]);
  const uint32_t k1 = __ballot_sync(0xffffffffu, keep[1]);
  const uint32_t t0 = __ballot_sync(0xffffffffu, keep[0] && two[0]);
  const uint32_t t1 = __ballot_sync(0xffffffffu, keep[1] && two[1]);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!keep[h]) continue;
    const int idx = h == 0 ? __popc(k0 & lt_mask) + __popc(t0 & lt_mask)
                           : __popc(k0) + __popc(t0) + __popc(k1 & lt_mask) + __popc(t1 & lt_mask);
    const int j0 = blk[h] * kBlockSize;
    TileDesc d;
    d.k_off = kv_offset(p.k, p.kv, b, kh, j0);
    d.v_off = kv_offset(p.v, p.kv, b, kh, j0);
    d.scale_row = p.k.dtype == DType::kNVFP4 ? kv_scale_row(p.kv, p.num_kv_heads, b, kh, j0) : 0;
    d.n_valid = min(kTileKeys, vis[h]);
    d.pad = 0;
    if constexpr (kTmaCoord) {
      static_assert(kTileKeys == kBlockSize, "one tile a block");
      d.pad = qm_tma_coord(p, b, page[h], j0);
    }
    s_tiles[idx] = d;
    if (two[h]) {
      // Second half of the block: keys 64 .. vis; rows of a block are stride_token apart.
      d.k_off += int64_t(kTileKeys) * p.k.stride_token;
      d.v_off += int64_t(kTileKeys) * p.v.stride_token;
      d.scale_row += int64_t(kTileKeys) * scale_row_step(p);
      d.n_valid = vis[h] - kTileKeys;
      s_tiles[idx + 1] = d;
    }
  }
  return __popc(k0) + __popc(k1) + __popc(t0) + __popc(t1);
}

// Split s's share of an MTP union item's blocks, as one warp finds it: entry lane + 32 h of the
// request's lists (token-major) is blk[h], the per-token visible key counts of its block (byte t:
// keys token t sees, 0 when t did not select it) are counts[h], and sel[h] says that the entry is
// the first naming its block (the union's order) and that the block is in split s's share (the
// union index of a kept entry is its rank among the warp's sel entries, h = 0 before h = 1).
struct MtpUnionEntries {
  int blk[2];
  uint32_t counts[2];
  bool sel[2];
};

// Warp 0, MTP union item (args.mtp_tokens > 0): the rows of request b (its n_tok tokens, each with
// its own q2k list) and kv head kh. The union of the tokens' used, visible, valid-page blocks
// (token 0's list order, then the blocks token 1 adds, ...; semantics.h rules per token) and split
// s's share of it. The entries are read straight into registers (two independent loads per lane),
// and the per-token end of list, the union and its counts come from ballots, __match_any_sync,
// __reduce_or_sync and one 32-step pass of the second half's entries against the first: no loop
// over all entries (the two 64-step shuffle loops this replaced were ~2 us of one warp on the way
// to an item's first K / V).
MSA_DEVICE MtpUnionEntries mtp_union_entries(const QueryMajorArgs& args, int b, int kh, int split, int lane) {
  const SparseAttnParams& p = args.p;
  const RowRange rr = q_rows(p.qi, p.total_q, b);
  const int n_tok = min(rr.len, args.mtp_tokens);
  const int n_e = n_tok * p.topk;  // <= 64 (host)
  int v[2], tok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int e = lane + 32 * h;
    tok[h] = e < n_e ? e / p.topk : 0;
    v[h] = e < n_e ? q2k_row(p, kh, rr.begin + tok[h])[e - tok[h] * p.topk] : -1;
  }
  const int seqlen_k = kv_seqlen(p.kv, b);
  const int nb = num_blocks(seqlen_k);
  const int64_t q_off = q_offset_of(p.q_offset, b, rr.len, seqlen_k);
  // Per token, the entries after its first negative one are not read (q2k_length): entry e of
  // token t is read when no entry in [t * topk, e) is negative.
  const uint64_t neg = uint64_t(__ballot_sync(0xffffffffu, v[0] < 0 && lane < n_e)) |
                       uint64_t(__ballot_sync(0xffffffffu, v[1] < 0 && lane + 32 < n_e)) << 32;
  bool used[2];
  int vis[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int e = lane + 32 * h;
    const uint64_t before = ((uint64_t(1) << e) - 1u) & ~((uint64_t(1) << (tok[h] * p.topk)) - 1u);
    used[h] = e < n_e && v[h] >= 0 && v[h] < nb && (neg & before) == 0u;
    const int lim = col_limit(p.causal, q_off, tok[h], seqlen_k);
    const int64_t vis64 = int64_t(lim) - int64_t(used[h] ? v[h] : 0) * kBlockSize;
    vis[h] = used[h] ? int(vis64 < kBlockSize ? (vis64 > 0 ? vis64 : 0) : int64_t(kBlockSize)) : 0;
    used[h] = used[h] && vis[h] > 0;
    if (used[h] && p.kv.paged) used[h] = kv_page(p.kv, b, v[h]) >= 0;
  }
  // Union: an entry is kept when no earlier used entry (any token) names its block; its counts
  // gather the visible keys of every used entry naming the block (byte t: token t's). A repeat
  // within one token adds the same byte again, so q2k_entry_used's repeats need no pass of their
  // own. Unused entries get keys that match nothing (distinct negatives).
  const uint32_t lt_mask = (1u << lane) - 1u;
  int key[2];
  uint32_t part[2], packed[2];
  bool keep[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    key[h] = used[h] ? v[h] : -1 - (lane + 32 * h);
    part[h] = used[h] ? uint32_t(vis[h]) << (8 * tok[h]) : 0u;
    const uint32_t same = __match_any_sync(0xffffffffu, key[h]);
    packed[h] = __reduce_or_sync(same, part[h]);
    keep[h] = used[h] && (same & lt_mask) == 0u;
  }
  if (n_e > 32) {  // uniform: the second half's entries against the first half's
#pragma unroll 8
    for (int j = 0; j < 32; ++j) {
      const int k0 = __shfl_sync(0xffffffffu, key[0], j);
      const uint32_t p0 = __shfl_sync(0xffffffffu, part[0], j);
      const int k1 = __shfl_sync(0xffffffffu, key[1], j);
      const uint32_t p1 = __shfl_sync(0xffffffffu, part[1], j);
      if (k0 == key[1]) {
        packed[1] |= p0;
        keep[1] = false;
      }
      if (k1 == key[0]) packed[0] |= p1;
    }
  }
  const uint32_t u0 = __ballot_sync(0xffffffffu, keep[0]);
  const uint32_t u1 = __ballot_sync(0xffffffffu, keep[1]);
  const int n_used = __popc(u0) + __popc(u1);
  const int per_split = (n_used + args.splits - 1) / args.splits;
  const int s_begin = split * per_split;
  const int s_end = min(n_used, s_begin + per_split);
  MtpUnionEntries r;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rank = h == 0 ? __popc(u0 & lt_mask) : __popc(u0) + __popc(u1 & lt_mask);
    r.sel[h] = keep[h] && rank >= s_begin && rank < s_end;
    r.blk[h] = v[h];
    r.counts[h] = packed[h];
  }
  return r;
}

// Warp 0, MTP union item: split s's share of the union (mtp_union_entries) cut into <= 2 tiles of
// 64 keys per block holding the keys below the largest limit. TileDesc.pad packs, per token t (byte
// t), how many leading keys of the tile t sees: 0 when t did not select the block. Returns the
// number of tiles (all lanes). kTileKeys = 128 (the register conversion): one tile per block.
template <int kTileKeys = kQmTileKeys>
MSA_DEVICE int plan_mtp_item(const QueryMajorArgs& args, int b, int kh, int split,
                             TileDesc* s_tiles, int lane) {
  const SparseAttnParams& p = args.p;
  const MtpUnionEntries ue = mtp_union_entries(args, b, kh, split, lane);
  const uint32_t lt_mask = (1u << lane) - 1u;
  const bool(&sel)[2] = ue.sel;
  const int(&v)[2] = ue.blk;
  const uint32_t(&packed)[2] = ue.counts;
  int vmax[2];
  bool two[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    vmax[h] = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) vmax[h] = max(vmax[h], int((packed[h] >> (8 * t)) & 0xFFu));
    two[h] = sel[h] && vmax[h] > kTileKeys;
  }
  const uint32_t k0 = __ballot_sync(0xffffffffu, sel[0]);
  const uint32_t k1 = __ballot_sync(0xffffffffu, sel[1]);
  const uint32_t t0 = __ballot_sync(0xffffffffu, two[0]);
  const uint32_t t1 = __ballot_sync(0xffffffffu, two[1]);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!sel[h]) continue;
    const int idx = h == 0 ? __popc(k0 & lt_mask) + __popc(t0 & lt_mask)
                           : __popc(k0) + __popc(t0) + __popc(k1 & lt_mask) + __popc(t1 & lt_mask);
    const int j0 = v[h] * kBlockSize;
    // Per-token counts of the first 64 keys (min(vis, 64)) and of the second (vis - 64, >= 0).
    uint32_t first = 0u, second = 0u;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int c = int((packed[h] >> (8 * t)) & 0xFFu);
      first |= uint32_t(min(c, kTileKeys)) << (8 * t);
      second |= uint32_t(max(c - kTileKeys, 0)) << (8 * t);
    }
    TileDesc d;
    d.k_off = kv_offset(p.k, p.kv, b, kh, j0);
    d.v_off = kv_offset(p.v, p.kv, b, kh, j0);
    d.scale_row = p.k.dtype == DType::kNVFP4 ? kv_scale_row(p.kv, p.num_kv_heads, b, kh, j0) : 0;
    d.n_valid = min(kTileKeys, vmax[h]);
    d.pad = int(first);
    s_tiles[idx] = d;
    if (two[h]) {
      d.k_off += int64_t(kTileKeys) * p.k.stride_token;
      d.v_off += int64_t(kTileKeys) * p.v.stride_token;
      d.scale_row += int64_t(kTileKeys) * scale_row_step(p);
      d.n_valid = vmax[h] - kTileKeys;
      d.pad = int(second);
      s_tiles[idx + 1] = d;
    }
  }
  return __popc(k0) + __popc(k1) + __popc(t0) + __popc(t1);
}

// Loads the item's query rows (heads rt * kRows + i of kv head kh of token r) into the Q tile;
// rows past G are zero. bf16/fp16 q by cp.async (joins the first commit group); fp8 q (decode) is
// converted to bf16 through registers.
// kMtp: row i of the tile is head i % G of token r + i / G (n_tok tokens; rows past them are zero).
template <typename Elem, int kRows, bool kMtp = false>
MSA_DEVICE void load_query_rows(const QueryMajorArgs& args, int r, int kh, int rt, uint8_t* sQ,
                                int tid, int n_tok = 0) {
  const SparseAttnParams& p = args.p;
  // Token row and head of tile row `row`; false for rows past the item's heads / tokens.
  auto source = [&](int row, int64_t& rq, int& hh) {
    if constexpr (kMtp) {
      const int t = row / args.group;
      hh = row - t * args.group;
      rq = int64_t(r) + t;
      return t < n_tok;
    } else {
      hh = rt * kRows + row;
      rq = r;
      return hh < args.group;
    }
  };
  if (!args.q_fp8) {
    const Elem* q = static_cast<const Elem*>(p.q);
    for (int c = tid; c < kRows * 16; c += kQmThreads) {
      const int row = c >> 4, ch = c & 15;
      int64_t rq;
      int hh;
      const bool ok = source(row, rq, hh);
      const Elem* src =
          q + rq * p.q_stride_token + int64_t(kh * args.group + hh) * p.q_stride_head + ch * 8;
      cp_async_16_zfill(smem_addr(sQ) + swizzle_128x16b_bytes(row, ch), ok ? src : q, ok);
    }
  } else {
    const uint8_t* q = static_cast<const uint8_t*>(p.q);
    for (int c = tid; c < kRows * 8; c += kQmThreads) {
      const int row = c >> 3, ch = c & 7;
      int64_t rq;
      int hh;
      uint4 in = make_uint4(0u, 0u, 0u, 0u);
      if (source(row, rq, hh))
        in = *reinterpret_cast<const uint4*>(q + rq * p.q_stride_token +
                                             int64_t(kh * args.group + hh) * p.q_stride_head + ch * 16);
      uint4 lo, hi;
      e4m3x16_to<Elem>(in, lo, hi);
      *reinterpret_cast<uint4*>(sQ + swizzle_128x16b_bytes(row, 2 * ch)) = lo;
      *reinterpret_cast<uint4*>(sQ + swizzle_128x16b_bytes(row, 2 * ch + 1)) = hi;
    }
  }
}

// Eight consecutive values of a row (dims elem_off .., elem_off a multiple of 2) times mul.
template <StoreKind kKind, bool kPartial = false>
MSA_DEVICE void store_row8(void* base, int64_t elem_off, const float (&v)[8], float mul) {
  constexpr int kE = store_kind_bytes(kKind);
  uint8_t* dst = static_cast<uint8_t*>(base) + elem_off * kE;
#pragma unroll
  for (int q = 0; q < 4; ++q) store_pair<kKind, kPartial>(dst + 2 * q * kE, v[2 * q] * mul, v[2 * q + 1] * mul);
}

// One MTP union item of the cooperative fp8 register variant (QueryMajorConfig::kCoop; the work
// split of kv_regs.cuh "MTP union items, cooperative"), run by all 128 threads once the item's
// plan, its Q copies and its first tile copies are issued: rows 16 mt + gid (+ 8) of every m tile
// in every warp, keys 32 w .. + 31 of Q K^T and head dims 32 w .. + 31 of P V in warp w. Per block:
// Q K^T, the row maxima of the 4 warps exchanged through s_rowmax (a barrier: every warp holds the
// same maxima, hence the same running max, rescale decisions and factors, so that its partial row
// sums add up), P as fp16 over the block's raw K (a barrier), P V. The per-warp sums are added in a
// fixed order at the end.
template <typename Cfg, typename Elem, typename IssueTile>
MSA_DEVICE void mtp_coop_item(const QueryMajorArgs& args, int r0, int n_tok, int kh, int split,
                              int n_tiles, const TileDesc* s_tiles, uint8_t* sQ, uint8_t* s_union,
                              float* s_rowmax, int lane, int warp, const IssueTile& issue_tile) {
  constexpr int kMT = 4, kNT = 4;  // 64 rows; 32 keys (Q K^T) / 32 dims (P V) per warp
  const SparseAttnParams& p = args.p;
  const int gid = lane >> 2, tig = lane & 3;
  const float temp = p.lse_temperature;
  const int key0 = 32 * warp;

  // Row factors of all 64 rows (fp16 logits -> base-2 units); each warp stashes the fp16 Q
  // fragments of its own m tile over its rows of the Q tile.
  float row_mul[kMT][2] = {};
  if (n_tiles > 0) {  // uniform
    cp_async_wait<Cfg::kStages - 1>();
    __syncthreads();
    uint32_t qa[8][4];
    float own[2];
    load_q_frags_f16<Elem>(sQ, 16 * warp, lane, args.scale_log2, qa, own);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      uint32_t other[8][4];  // only the factors are kept
      load_q_frags_f16<Elem>(sQ, 16 * mt, lane, args.scale_log2, other, row_mul[mt]);
    }
    __syncthreads();
    stash_q_frags(qa, sQ + warp * kQFragBytes, lane);
    // The first iteration's barrier orders these stores before any warp reads them.
  }

  // Byte of TileDesc.pad with the visible keys of each fragment row's token (-1: padding row).
  int tok_shift[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = (16 * mt + gid + 8 * h) / args.group;
      tok_shift[mt][h] = t < n_tok ? 8 * t : -1;
    }

  float o[kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][j][e] = 0.0f;
  SoftmaxState<kMT> st;
  st.init();
  // The maxima of the 4 warps' keys of each row, in a fixed order (the same in every warp).
  auto cta_max = [&](float (&mx)[kMT][2]) {
    if (tig == 0) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) s_rowmax[(16 * mt + gid + 8 * h) * 4 + warp] = mx[mt][h];
    }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 v = *reinterpret_cast<const float4*>(s_rowmax + (16 * mt + gid + 8 * h) * 4);
        mx[mt][h] = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
      }
  };

  for (int i = 0; i < n_tiles; ++i) {
    cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();  // tile i landed for every thread; everyone is done with tile i - 1 (and P)
    const int nx = i + Cfg::kStages - 1;
    if (nx < n_tiles) issue_tile(nx, nx % Cfg::kStages);
    cp_async_commit();

    uint8_t* raw = s_union + (i % Cfg::kStages) * Cfg::kStageBytes;
    // Each row sees the leading keys its token sees (0: its token did not select the block); the
    // warp's keys start at key0. All of these are the same in every warp (the 64 rows' counts).
    const uint32_t counts = uint32_t(s_tiles[i].pad);
    int lim[kMT][2];
    bool whole = true;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = tok_shift[mt][h] >= 0 ? int((counts >> tok_shift[mt][h]) & 0xFFu) : 0;
        lim[mt][h] = c - key0;
        whole = whole && c >= kBlockSize;
      }
    // Every row sees the whole block and no temperature LSE: no per-key mask or temperature branch.
    const bool plain = !args.has_temp && __all_sync(0xffffffffu, whole);

    float s[kMT][kNT][4];
    qk_fp8_regs_rows<kMT, kNT>(s, sQ, raw, key0, lane);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= row_mul[mt][e >> 1];
    if (plain) {  // CTA-uniform (cta_max holds a barrier)
      softmax_step<kMT, kNT, false>(s, o, st, lim, 1.0f, false, temp, lane,
                                    regs_rescale_slack(false, temp), cta_max);
    } else {
      softmax_step<kMT, kNT>(s, o, st, lim, 1.0f, args.has_temp, temp, lane,
                             regs_rescale_slack(args.has_temp, temp), cta_max);
    }
    // Every warp is past its Q K^T (the barrier in cta_max): P replaces the block's raw K.
    p_store_f16<kMT, kNT>(s, raw, key0, lane);
    __syncthreads();
    pv_fp8_regs_dims<kMT>(o, smem_addr(raw), raw + Cfg::kStageBytes / 2, 32 * warp, lane);
  }

  // The row sums: each warp's over its keys, added over the warps in a fixed order.
  st.quad_reduce();
  cp_async_wait<0>();
  __syncthreads();  // the pipeline is free
  float* sums = reinterpret_cast<float*>(s_union);  // [2][64 rows][4 warps]: l, lt
  if (tig == 0) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = 16 * mt + gid + 8 * h;
        sums[row * 4 + warp] = st.l[mt][h];
        sums[256 + row * 4 + warp] = st.lt[mt][h];
      }
  }
  __syncthreads();

  const int dim = 32 * warp + 8 * tig;  // the lane's 8 output dims of each of its rows
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * mt + gid + 8 * h;
      const float4 lv = *reinterpret_cast<const float4*>(sums + row * 4);
      const float4 tv = *reinterpret_cast<const float4*>(sums + 256 + row * 4);
      const float l = ((lv.x + lv.y) + lv.z) + lv.w;
      const float lt = ((tv.x + tv.y) + tv.z) + tv.w;
      const int t = row / args.group;
      if (t >= n_tok) continue;  // a padding row
      const int hh = row - t * args.group;
      const int64_t rq = int64_t(r0) + t;
      float v[8];
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int j = 0; j < kNT; ++j) v[4 * e + j] = o[mt][j][2 * h + e];
      const bool lse_lane = warp == 0 && tig == 0;
      if (args.write_final) {
        const int64_t idx = rq * p.num_heads + kh * args.group + hh;
        store_row8<kElemStoreKind<Elem>>(p.out, idx * 128 + dim, v,
                                         l > 0.0f ? p.v_global_scale / l : 0.0f);
        if (lse_lane && p.lse != nullptr) p.lse[idx] = row_lse2(st.m[mt][h], l) * kLn2;
        if (lse_lane && p.lse_temperature_out != nullptr)
          p.lse_temperature_out[idx] = row_lse2_t(st.m[mt][h], lt, temp) * kLn2;
      } else {
        // Slot (kh, row, split, head) of the combine's layout.
        const int64_t slot = ((int64_t(kh) * p.total_q + rq) * args.splits + split) * args.group + hh;
        const float mul = l > 0.0f ? 1.0f / l : 0.0f;
        switch (args.part_kind) {
          case StoreKind::kF32: store_row8<StoreKind::kF32>(args.part_o, slot * 128 + dim, v, mul); break;
          case StoreKind::kBF16: store_row8<StoreKind::kBF16, true>(args.part_o, slot * 128 + dim, v, mul); break;
          case StoreKind::kF16: store_row8<StoreKind::kF16, true>(args.part_o, slot * 128 + dim, v, mul); break;
          default: store_row8<StoreKind::kFP8>(args.part_o, slot * 128 + dim, v, mul); break;
        }
        if (lse_lane) args.part_lse[slot] = row_lse2(st.m[mt][h], l);
        if (lse_lane && args.part_lse_t != nullptr)
          args.part_lse_t[slot] = row_lse2_t(st.m[mt][h], lt, temp);
      }
    }
}

// split=cluster (kCluster): the split CTAs of one (row, kv head, row tile) run as one thread-block
// cluster (rank = split). Each writes its partial as the combine would read it (the tile's rows
// of part_kind values normalised by their l, and their log2 LSEs) into its own shared memory,
// after the epilogue's buffers; after a cluster barrier the CTAs merge the rows in parallel (tile
// row i by warp i / S of rank i % S), each reading the S partials of its row from the cluster's
// shared memory with merge_row, the combine kernel's own code and slot order; a second
// cluster barrier keeps every CTA's shared memory alive until the last read.
template <typename Cfg>
struct QueryMajorClusterLayout {
  static constexpr int kPartOffset = Cfg::kUnionOffset + Cfg::kEpilogueBytes;  // [kRows][128] values
  static constexpr int kLseOffset = kPartOffset + Cfg::kRows * 128 * 4;        // [kRows] floats
  static constexpr int kLseTOffset = kLseOffset + Cfg::kRows * 4;              // [kRows] floats
  static constexpr int kEnd = kLseTOffset + Cfg::kRows * 4;
  static constexpr int kRows = Cfg::kRows;
  static constexpr int kWarps = kQmThreads / 32;  // the merge's warps per CTA
  static constexpr int kSmemBytes = kEnd > Cfg::kSmemBytes ? kEnd : Cfg::kSmemBytes;
  static_assert(kPartOffset % 16 == 0, "16-byte partial rows");
  // The streaming variant keeps its 105 KB (2 CTAs per SM); the others fit every SM80+ GPU.
  static_assert(kSmemBytes == Cfg::kSmemBytes || kSmemBytes <= 99 * 1024,
                "cluster partials fit");
};

// The slots of tile row `row` in the cluster's shared memory (merge_row's source): slot
// s is the partial of the CTA of rank s.
template <StoreKind kKind>
struct ClusterSlots {
  uint32_t part;   // this CTA's shared-window address of the partial rows
  uint32_t lse_a;  // of the LSEs of the row
  uint32_t lse_t_a;
  int row;
  MSA_DEVICE float lse(int s) const {
    return sanitize_lse(ld_cluster_f32(cluster_map(lse_a, uint32_t(s))));
  }
  MSA_DEVICE float lse_t(int s) const {
    return sanitize_lse(ld_cluster_f32(cluster_map(lse_t_a, uint32_t(s))));
  }
  MSA_DEVICE Raw8 load(int s, int hl) const {
    constexpr int kE = store_kind_bytes(kKind);
    return load8_cluster<kKind>(
        cluster_map(part + uint32_t((row * 128 + 8 * hl) * kE), uint32_t(s)));
  }
};

// split=cluster: the merge of one item's tile rows once every CTA of the cluster has written its
// partial (all threads of the CTA call it).
template <typename Elem, typename Cl>
MSA_DEVICE void cluster_merge(const QueryMajorArgs& args, uint8_t* smem, int r, int kh, int rt, int rank,
                              int warp, int lane) {
  constexpr int kRows = Cl::kRows;
  const SparseAttnParams& p = args.p;
  cluster_sync();  // every CTA's partial is written
  const int S = args.splits;
  // Tile row i by warp i / S of rank i % S: the rows spread over the cluster's SMs first.
  for (int i = warp * S + rank; i < kRows; i += S * Cl::kWarps) {  // warp-uniform
    const int hh = rt * kRows + i;
    if (hh >= args.group) break;
    const int64_t out_idx = int64_t(r) * p.num_heads + kh * args.group + hh;
    const uint32_t base = smem_addr(smem);
    auto merge = [&]<StoreKind kKind>() {
      const ClusterSlots<kKind> slots{base + uint32_t(Cl::kPartOffset), base + uint32_t(Cl::kLseOffset + 4 * i),
                                      base + uint32_t(Cl::kLseTOffset + 4 * i), i};
      merge_row<Elem, kKind>(slots, S, p.v_global_scale, p.out, p.lse, p.lse_temperature_out, out_idx,
                                      lane);
    };
    switch (args.part_kind) {
      case StoreKind::kF32: merge.template operator()<StoreKind::kF32>(); break;
      case StoreKind::kBF16: merge.template operator()<StoreKind::kBF16>(); break;
      case StoreKind::kF16: merge.template operator()<StoreKind::kF16>(); break;
      default: merge.template operator()<StoreKind::kFP8>(); break;
    }
  }
  cluster_sync();  // no CTA's shared memory is read after it exits
}

// 3 CTAs per SM for 16-row tiles (decode: enough bytes in flight, ~150 registers); 2 for 64-row
// tiles, whose shared memory allows no more and which need ~170 registers, and for the register
// variant (105 KB of shared memory; MTP union items in registers: 86 KB and 64 rows of S per
// warp).
// kTma (regs_feed=tma, kv_regs_tma.cuh): the 16-row fp8 register variant with its stages filled by
// TMA (sm_90a; the parameters carry the K / V maps).
template <typename Elem, KvKind kKv, int kWarpsM, bool kRegs, bool kMtp, bool kWordCvt, bool kCluster,
          bool kTma = false>
__global__ void __launch_bounds__(kQmThreads, kWarpsM == 1 && !kRegs ? 3 : 2)
    query_major_kernel(const __grid_constant__ std::conditional_t<kTma, QueryMajorTmaArgs, QueryMajorArgs> args) {
  using Cfg = QueryMajorConfig<Elem, kKv, kWarpsM, kRegs>;
  using Cl = QueryMajorClusterLayout<Cfg>;
  static_assert(!kTma || (kRegs && kKv == KvKind::kFp8 && kWarpsM == 1 && !kMtp && !kCluster),
                "regs_feed=tma: the 16-row fp8 register variant, per-token items");
  static_assert(!kMtp || kWarpsM == 4, "MTP union items: 64-row tiles");
  static_assert(!kWordCvt || (kKv == KvKind::kNvfp4 && kRegs && kWarpsM == 1),
                "nvfp4_cvt=word: the 16-row register variant with NVFP4 K/V");
  static_assert(!kCluster || !kMtp, "split=cluster: per-token items");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (kCluster) {  // no clusters below sm_90: never planned there (prepare_cluster_launch)
    __trap();
    return;
  }
#endif
  static_assert(!kRegs || kWarpsM == 1 || (kMtp && Cfg::kCoop),
                "64-row register tiles: MTP union items of fp8 K/V");
  extern __shared__ __align__(1024) uint8_t smem[];
  const SparseAttnParams& p = args.p;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int w_m = warp % kWarpsM, w_n = warp / kWarpsM;

  uint8_t* sQ = smem + Cfg::kQOffset;
  TileDesc* s_tiles = reinterpret_cast<TileDesc*>(smem + Cfg::kTilesOffset);
  int* s_misc = reinterpret_cast<int*>(smem + Cfg::kMiscOffset);
  uint8_t* s_union = smem + Cfg::kUnionOffset;
  [[maybe_unused]] float* s_rowmax = reinterpret_cast<float*>(smem + Cfg::kRowMaxOffset);
  const uint32_t sQ_addr = smem_addr(sQ);
  check_smem_base(smem);
  const int scale_step = scale_row_step(p);
  const float temp = p.lse_temperature;
  // kTma: the stages' barriers, and the blocks this CTA has consumed over its items (block g uses
  // stage g % kStages).
  [[maybe_unused]] const QmTmaBars<Cfg::kStages> tma_bars{smem_addr(smem + Cfg::kBarOffset)};
  [[maybe_unused]] uint32_t fed = 0;
  if constexpr (kTma) {
    if (tid == 0) qm_tma_init<Cfg::kStages, Cfg::kWarps>(args, tma_bars);
    // The item loop's first barrier publishes the barriers' initialization.
  }

  for (int64_t item = blockIdx.x; item < args.num_items; item += gridDim.x) {
    const int split = int(item % args.splits);
    int64_t rest = item / args.splits;
    const int rt = int(rest % args.row_tiles);
    rest /= args.row_tiles;
    const int kh = int(rest % p.num_kv_heads);
    const int r = int(rest / p.num_kv_heads);  // MTP union items: the request
    // MTP union items: the request's first row and its tokens (rows are token-major, G heads each).
    int r0 = r, n_tok = 1;
    if constexpr (kMtp) {
      const RowRange rr = q_rows(p.qi, p.total_q, r);
      r0 = rr.begin;
      n_tok = min(rr.len, args.mtp_tokens);
    }

    // kTma: this thread's generic writes of the previous item (merge, staging) over the stages,
    // ordered before the async proxy's loads into them (thread 0 issues after the barriers below).
    if constexpr (kTma) qm_tma_fence();
    __syncthreads();  // the previous item is done with every shared buffer
    if (warp == 0) {
      int n;
      if constexpr (kMtp) {
        n = plan_mtp_item<Cfg::kTileKeys>(args, r, kh, split, s_tiles, lane);
      } else {
        n = plan_query_major_item<kWarpsM, Cfg::kTileKeys, kTma>(args, r, kh, split, s_tiles, lane);
      }
      if (lane == 0) s_misc[0] = n;
    }
    load_query_rows<Elem, Cfg::kRows, kMtp>(args, r0, kh, rt, sQ, tid, n_tok);
    cp_async_commit();
    __syncthreads();
    const int n_tiles = s_misc[0];

    // Stage st holds K then V (compute tiles for native KV, raw bytes otherwise).
    auto stage_addr = [&](int st) { return smem_addr(s_union) + uint32_t(st * Cfg::kStageBytes); };
    auto issue_tile = [&](int tile, int st) {
      const TileDesc d = s_tiles[tile];
      constexpr int kHalf = Cfg::kStageBytes / 2;
      if constexpr (Cfg::kRegConvert && kKv == KvKind::kFp8) {
        issue_fp8_rows_swizzled<Cfg::kTileKeys, kQmThreads>(p.k, d.k_off, d.n_valid,
                                                            stage_addr(st), tid);
        issue_fp8_rows_swizzled<Cfg::kTileKeys, kQmThreads>(p.v, d.v_off, d.n_valid,
                                                            stage_addr(st) + kHalf, tid);
      } else if constexpr (Cfg::kRegConvert) {  // NVFP4: whole raw blocks, data then scales
        issue_kv_rows<Elem, kKv, Cfg::kTileKeys, kQmThreads>(p.k, d.k_off, d.scale_row, scale_step,
                                                            d.n_valid, stage_addr(st), tid);
        issue_kv_rows<Elem, kKv, Cfg::kTileKeys, kQmThreads>(p.v, d.v_off, d.scale_row, scale_step,
                                                            d.n_valid, stage_addr(st) + kHalf, tid);
      } else {
        issue_kv_rows<Elem, kKv, kQmTileKeys, kQmThreads>(p.k, d.k_off, d.scale_row, scale_step,
                                                         d.n_valid, stage_addr(st), tid);
        issue_kv_rows<Elem, kKv, kQmTileKeys, kQmThreads>(p.v, d.v_off, d.scale_row, scale_step,
                                                         d.n_valid, stage_addr(st) + kHalf, tid);
      }
    };
    if constexpr (kTma) {  // the first kStages - 1 blocks, by thread 0
      if (tid == 0) {
        for (int t = 0; t < Cfg::kStages - 1 && t < n_tiles; ++t)
          qm_tma_load(args, tma_bars, s_tiles[t], kh, stage_addr(int((fed + t) % Cfg::kStages)), fed + t);
      }
    } else {
#pragma unroll
      for (int st = 0; st < Cfg::kStages - 1; ++st) {
        if (st < n_tiles) issue_tile(st, st);
        cp_async_commit();
      }
    }
    if constexpr (Cfg::kCoop) {  // MTP union items, fp8 K/V in registers, warps cooperating
      mtp_coop_item<Cfg, Elem>(args, r0, n_tok, kh, split, n_tiles, s_tiles, sQ, s_union, s_rowmax,
                               lane, warp, issue_tile);
      continue;
    }
    float row_mul[2];  // register variant: per fragment row, fp16 logits -> base-2 units
    // The warp's fp16 Q fragments (register variant, 16-row tiles; kCoop items took the branch
    // above): one copy at the Q tile that all warps read.
    [[maybe_unused]] uint8_t* const sQf = sQ;
    if constexpr (Cfg::kRegConvert) {
      if (n_tiles > 0) {  // uniform
        // Q landed once all but the kStages - 1 tile groups are done (its copies are the first
        // group; kTma: the only group). Every warp reads its 16 rows and keeps its row factors;
        // then warp 0 (every warp has the same rows) overwrites the Q tile with the fp16 fragments
        // read from here on.
        if constexpr (kTma) {
          cp_async_wait<0>();
        } else {
          cp_async_wait<Cfg::kStages - 1>();
        }
        __syncthreads();
        uint32_t qa[8][4];
        load_q_frags_f16<Elem>(sQ, w_m * 16, lane, args.scale_log2, qa, row_mul);
        if constexpr (kKv == KvKind::kNvfp4) {  // the NVFP4 logits come out x 2^-7 (kv_regs.cuh)
          row_mul[0] *= kNvfp4RegsUnscale;
          row_mul[1] *= kNvfp4RegsUnscale;
        }
        if constexpr (kWordCvt) q_frags_word_order(qa);  // the dims of qk_nvfp4_regs<.., true>
        __syncthreads();
        if (warp == 0) stash_q_frags(qa, sQf, lane);
        // The first iteration's barrier orders these stores before any warp reads them (kTma:
        // no barrier per block, so one here).
        if constexpr (kTma) __syncthreads();
      }
    }

    // MTP union items: byte of TileDesc.pad holding the visible keys of each fragment row's token
    // (-1: a padding row past the request's tokens).
    int tok_shift[2] = {-1, -1};
    if constexpr (kMtp) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = (w_m * 16 + (lane >> 2) + 8 * h) / args.group;
        tok_shift[h] = t < n_tok ? 8 * t : -1;
      }
    }

    float o[1][16][4];
#pragma unroll
    for (int d = 0; d < 16; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[0][d][e] = 0.0f;
    SoftmaxState<1> st;
    st.init();

    for (int i = 0; i < n_tiles; ++i) {
      [[maybe_unused]] const uint32_t g = fed + uint32_t(i);  // kTma: the block over the CTA's items
      if constexpr (kTma) {
        // Thread 0 refills the stage of block g - 1 with block g + kStages - 1 once every warp
        // released it; every warp then waits for block g only.
        const int nx = i + Cfg::kStages - 1;
        if (tid == 0 && nx < n_tiles)
          qm_tma_load(args, tma_bars, s_tiles[nx], kh, stage_addr(int((g + Cfg::kStages - 1) % Cfg::kStages)),
                      g + Cfg::kStages - 1);
        __syncwarp();
        qm_tma_wait(tma_bars, g);
      } else {
        cp_async_wait<Cfg::kStages - 2>();
        __syncthreads();  // tile i landed for every thread; everyone is done with tile i - 1
        const int nx = i + Cfg::kStages - 1;
        if (nx < n_tiles) issue_tile(nx, nx % Cfg::kStages);
        cp_async_commit();
      }

      if constexpr (Cfg::kRegConvert) {
        const int stage = kTma ? int(g % Cfg::kStages) : i % Cfg::kStages;
        uint8_t* const raw = s_union + stage * Cfg::kStageBytes;
        const int key0 = w_n * Cfg::kWarpKeys;
        const int lim_rel = s_tiles[i].n_valid - key0;
        int lim[1][2] = {{lim_rel, lim_rel}};
        // kTma: V rows past the block's last visible key hold what the page holds there.
        if constexpr (kTma) {
          if (lim_rel > 0 && lim_rel < Cfg::kWarpKeys)  // warp-uniform
            qm_tma_zero_v_rows<Cfg::kWarpKeys>(raw + Cfg::kStageBytes / 2, key0, s_tiles[i].n_valid, lane);
        }
        if (lim_rel > 0) {  // warp-uniform
          float s[1][Cfg::kNT][4];
          if constexpr (kKv == KvKind::kNvfp4) {
            qk_nvfp4_regs<Cfg::kNT, kWordCvt>(s[0], sQf, raw, key0, lane);
          } else {
            qk_fp8_regs<Cfg::kNT>(s[0], sQf, raw, key0, lane);
          }
          regs_softmax_step(s, o, st, lim, row_mul, args.has_temp, temp, lane);
          if constexpr (kKv == KvKind::kNvfp4) {
            pv_nvfp4_regs<Cfg::kNT, kWordCvt>(o[0], s[0], raw + Cfg::kStageBytes / 2, key0, lane);
          } else {
            pv_fp8_regs<Cfg::kNT>(o[0], s[0], raw + Cfg::kStageBytes / 2, key0, lane);
          }
        }
        if constexpr (kTma) qm_tma_release(tma_bars, g, lane);
      } else {
        uint32_t sK, sV;
        if constexpr (kKv == KvKind::kNative) {
          sK = stage_addr(i % Cfg::kStages);
          sV = sK + Cfg::kTileBytes;
        } else {
          uint8_t* raw = s_union + (i % Cfg::kStages) * Cfg::kStageBytes;
          uint8_t* cbuf = s_union + Cfg::kStages * Cfg::kStageBytes;
          convert_kv_rows<Elem, kKv, kQmTileKeys, kQmThreads>(raw, cbuf, tid);
          convert_kv_rows<Elem, kKv, kQmTileKeys, kQmThreads>(raw + Cfg::kStageBytes / 2,
                                                              cbuf + Cfg::kTileBytes, tid);
          __syncthreads();
          sK = smem_addr(cbuf);
          sV = sK + Cfg::kTileBytes;
        }

        const int key0 = w_n * Cfg::kWarpKeys;
        int lim_rel = s_tiles[i].n_valid - key0;
        int lim[1][2] = {{lim_rel, lim_rel}};
        if constexpr (kMtp) {
          // Each row sees the leading keys its token sees (0: its token did not select the block);
          // a warp none of whose rows sees a key skips the tile (key0 = 0 with 64-row tiles).
          const uint32_t counts = uint32_t(s_tiles[i].pad);
#pragma unroll
          for (int h = 0; h < 2; ++h)
            lim[0][h] = tok_shift[h] >= 0 ? int((counts >> tok_shift[h]) & 0xFFu) : 0;
          lim_rel = __any_sync(0xffffffffu, lim[0][0] > 0 || lim[0][1] > 0) ? 1 : 0;
        }
        if (lim_rel > 0) {  // warp-uniform: skip a slice past the tile's last visible key
          float s[1][Cfg::kNT][4];
          gemm_qk<Elem, 1, Cfg::kNT>(s, ldm_base_a(sQ_addr, w_m * 16, lane), ldm_base_k(sK, key0, lane));
          softmax_step<1, Cfg::kNT>(s, o, st, lim, args.scale_log2, args.has_temp, temp, lane);
          gemm_pv<Elem, 1, Cfg::kNT>(o, s, ldm_base_v(sV, key0, lane));
        }
      }
    }
    st.quad_reduce();
    if constexpr (kTma) fed += uint32_t(n_tiles);  // each waited for by every warp: all landed
    cp_async_wait<0>();
    __syncthreads();  // pipeline buffers are free for the merge / staging

    if constexpr (Cfg::kWarpsN > 1) {
      float* merge = reinterpret_cast<float*>(s_union);
      if (w_n > 0) {
        float* mine = merge + ((w_n - 1) * kWarpsM + w_m) * Cfg::kMergeFloats * 32;
#pragma unroll
        for (int d = 0; d < 16; ++d)
#pragma unroll
          for (int e = 0; e < 4; ++e) mine[(d * 4 + e) * 32 + lane] = o[0][d][e];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mine[(64 + h) * 32 + lane] = st.m[0][h];
          mine[(66 + h) * 32 + lane] = st.l[0][h];
          mine[(68 + h) * 32 + lane] = st.lt[0][h];
        }
      }
      __syncthreads();
      if (w_n == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float m_all = st.m[0][h];
          for (int w = 1; w < Cfg::kWarpsN; ++w)
            m_all = fmaxf(m_all, merge[(((w - 1) * kWarpsM + w_m) * Cfg::kMergeFloats + 64 + h) * 32 + lane]);
          const float m_use = m_all == neg_inf() ? 0.0f : m_all;
          const float f0 = merge_factor(st.m[0][h], m_use);
          float l = st.l[0][h] * f0;
          float lt = args.has_temp ? st.lt[0][h] * merge_factor_t(st.m[0][h], m_use, temp) : 0.0f;
#pragma unroll
          for (int d = 0; d < 16; ++d) {
            o[0][d][2 * h] *= f0;
            o[0][d][2 * h + 1] *= f0;
          }
          for (int w = 1; w < Cfg::kWarpsN; ++w) {
            const float* other = merge + ((w - 1) * kWarpsM + w_m) * Cfg::kMergeFloats * 32;
            const float m_w = other[(64 + h) * 32 + lane];
            const float f = merge_factor(m_w, m_use);
            l += other[(66 + h) * 32 + lane] * f;
            if (args.has_temp) lt += other[(68 + h) * 32 + lane] * merge_factor_t(m_w, m_use, temp);
#pragma unroll
            for (int d = 0; d < 16; ++d) {
              o[0][d][2 * h] += other[(d * 4 + 2 * h) * 32 + lane] * f;
              o[0][d][2 * h + 1] += other[(d * 4 + 2 * h + 1) * 32 + lane] * f;
            }
          }
          st.m[0][h] = m_all;
          st.l[0][h] = l;
          st.lt[0][h] = lt;
        }
      }
    }

    if (w_n == 0) {
      uint8_t* stage = s_union + Cfg::kMergeBytes + w_m * Cfg::kStageOutBytes;
      // The register variant's accumulators hold permuted head dims (kv_regs.cuh).
      // kPartial: a split's partial (saturated, attention_core.cuh sat_partial).
      auto store = [&]<StoreKind kKind, bool kPartial = true>(const float(&mul)[2], void* gbase, int64_t row_off) {
        if constexpr (Cfg::kRegConvert) {
          store_rows_perm<kKind, kPartial>(o[0], mul, stage, gbase, row_off, lane);
        } else {
          store_rows<kKind, kPartial>(o[0], mul, stage, gbase, row_off, lane);
        }
      };
      const int gid = lane >> 2, tig = lane & 3;
      // Query row and head of tile row i; false for rows past the item's heads / tokens.
      auto row_of = [&](int i, int64_t& rq, int& hh) {
        if constexpr (kMtp) {
          const int t = i / args.group;
          hh = i - t * args.group;
          rq = int64_t(r0) + t;
          return t < n_tok;
        } else {
          hh = rt * Cfg::kRows + i;
          rq = r;
          return hh < args.group;
        }
      };
      int64_t rq_lane;
      int hh_lane;  // of row lane i < 16
      const bool row_ok = row_of(w_m * 16 + (lane & 15), rq_lane, hh_lane) && lane < 16;
      float mul[2];
      // The NVFP4 register variant's accumulators hold the output x 2^-7 (kv_regs.cuh).
      constexpr float kOutUnscale = Cfg::kRegConvert && kKv == KvKind::kNvfp4 ? kNvfp4RegsUnscale : 1.0f;
      if (args.write_final) {
        const int64_t out_row = rq_lane * p.num_heads + kh * args.group + hh_lane;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          mul[h] = st.l[0][h] > 0.0f ? p.v_global_scale * kOutUnscale / st.l[0][h] : 0.0f;
        store.template operator()<kElemStoreKind<Elem>, false>(mul, p.out, row_ok ? out_row * 128 : -1);
        if (tig == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            int64_t rq;
            int hh;
            if (!row_of(w_m * 16 + gid + 8 * h, rq, hh)) continue;
            const int64_t idx = rq * p.num_heads + kh * args.group + hh;
            if (p.lse != nullptr) p.lse[idx] = row_lse2(st.m[0][h], st.l[0][h]) * kLn2;
            if (p.lse_temperature_out != nullptr)
              p.lse_temperature_out[idx] = row_lse2_t(st.m[0][h], st.lt[0][h], temp) * kLn2;
          }
        }
      } else if constexpr (kCluster) {
        // split=cluster: the partial, as the combine would read it, at tile row i of this CTA's
        // shared memory (merged by cluster_merge below).
#pragma unroll
        for (int h = 0; h < 2; ++h) mul[h] = st.l[0][h] > 0.0f ? kOutUnscale / st.l[0][h] : 0.0f;
        const int64_t row_off = row_ok ? int64_t(w_m * 16 + (lane & 15)) * 128 : -1;
        void* const part = smem + Cl::kPartOffset;
        switch (args.part_kind) {
          case StoreKind::kF32: store.template operator()<StoreKind::kF32>(mul, part, row_off); break;
          case StoreKind::kBF16: store.template operator()<StoreKind::kBF16>(mul, part, row_off); break;
          case StoreKind::kF16: store.template operator()<StoreKind::kF16>(mul, part, row_off); break;
          default: store.template operator()<StoreKind::kFP8>(mul, part, row_off); break;
        }
        if (tig == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            int64_t rq;
            int hh;
            if (!row_of(w_m * 16 + gid + 8 * h, rq, hh)) continue;
            const int i = w_m * 16 + gid + 8 * h;
            reinterpret_cast<float*>(smem + Cl::kLseOffset)[i] = row_lse2(st.m[0][h], st.l[0][h]);
            if (args.has_temp)
              reinterpret_cast<float*>(smem + Cl::kLseTOffset)[i] = row_lse2_t(st.m[0][h], st.lt[0][h], temp);
          }
        }
      } else {
        // Slot (kh, row, split, head) of the combine's layout.
        auto slot = [&](int64_t rq, int hh) {
          return ((int64_t(kh) * p.total_q + rq) * args.splits + split) * args.group + hh;
        };
#pragma unroll
        for (int h = 0; h < 2; ++h) mul[h] = st.l[0][h] > 0.0f ? kOutUnscale / st.l[0][h] : 0.0f;
        const int64_t row_off = row_ok ? slot(rq_lane, hh_lane) * 128 : -1;
        switch (args.part_kind) {
          case StoreKind::kF32: store.template operator()<StoreKind::kF32>(mul, args.part_o, row_off); break;
          case StoreKind::kBF16: store.template operator()<StoreKind::kBF16>(mul, args.part_o, row_off); break;
          case StoreKind::kF16: store.template operator()<StoreKind::kF16>(mul, args.part_o, row_off); break;
          default: store.template operator()<StoreKind::kFP8>(mul, args.part_o, row_off); break;
        }
        if (tig == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            int64_t rq;
            int hh;
            if (!row_of(w_m * 16 + gid + 8 * h, rq, hh)) continue;
            args.part_lse[slot(rq, hh)] = row_lse2(st.m[0][h], st.l[0][h]);
            if (args.part_lse_t != nullptr)
              args.part_lse_t[slot(rq, hh)] = row_lse2_t(st.m[0][h], st.lt[0][h], temp);
          }
        }
      }
    }
    if constexpr (kCluster) cluster_merge<Elem, Cl>(args, smem, r, kh, rt, split, warp, lane);
  }
}

// split=cluster: one launch of `kernel` over `grid` CTAs as clusters of `cluster` consecutive CTAs.
inline void launch_cluster(void (*kernel)(QueryMajorArgs), const QueryMajorArgs& args, unsigned grid,
                           int threads, int smem_bytes, unsigned cluster, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = size_t(smem_bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  MSA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, args));
}

template <typename Elem, KvKind kKv, int kWarpsM, bool kRegs, bool kMtp, bool kWordCvt, bool kCluster, bool kTma>
void launch_query_major(const QueryMajorArgs& args, cudaStream_t stream) {
  using Cfg = QueryMajorConfig<Elem, kKv, kWarpsM, kRegs>;
  auto* kernel = query_major_kernel<Elem, kKv, kWarpsM, kRegs, kMtp, kWordCvt, kCluster, kTma>;
  if constexpr (kTma) {
    // regs_feed=tma: the K / V maps (NotSupported where the driver rejects them; the planner's
    // regs_feed rule keeps the calls it sends here within TMA's coordinates).
    QueryMajorTmaArgs ta{};
    static_cast<QueryMajorArgs&>(ta) = args;
    MSA_CHECK_SUPPORTED(flashmsa::cuda::encode_kv_maps_raw8(ta.k_map, ta.v_map, ta.p),
                        "regs_feed=tma: the driver rejected the TMA descriptors of k / v");
    flashmsa::cuda::prepare_launch(kernel, kQmThreads, Cfg::kSmemBytes);  // cached smem opt-in
    const int64_t grid = args.num_items < int64_t(INT_MAX) ? args.num_items : int64_t(INT_MAX);
    kernel<<<unsigned(grid), kQmThreads, Cfg::kSmemBytes, stream>>>(ta);
    MSA_CUDA_CHECK(cudaGetLastError());
  } else if constexpr (kCluster) {
    // One cluster per (row, kv head, row tile): its splits are consecutive items, one CTA each
    // (no grid-stride loop: every CTA of a cluster must reach its barriers).
    constexpr int kSmem = QueryMajorClusterLayout<Cfg>::kSmemBytes;
    const int max_size = flashmsa::cuda::prepare_cluster_launch(kernel, kQmThreads, kSmem);
    MSA_CHECK(!args.write_final && args.splits >= 1 && args.splits <= max_size &&
                  args.num_items % args.splits == 0 && args.num_items <= int64_t(INT_MAX),
              "msa_sparse_decode_attention: split=cluster with ", args.splits, " splits of ", args.num_items,
              " items, clusters of at most ", max_size, " CTAs here (planner bug)");
    launch_cluster(kernel, args, unsigned(args.num_items), kQmThreads, kSmem, unsigned(args.splits), stream);
  } else {
    flashmsa::cuda::prepare_launch(kernel, kQmThreads, Cfg::kSmemBytes);  // cached smem opt-in
    // Items beyond the largest grid are picked up by the grid-stride loop.
    const int64_t grid = args.num_items < int64_t(INT_MAX) ? args.num_items : int64_t(INT_MAX);
    kernel<<<unsigned(grid), kQmThreads, Cfg::kSmemBytes, stream>>>(args);
    MSA_CUDA_CHECK(cudaGetLastError());
  }
}

// CTAs per SM of regs_feed=tma's kernel (16-row fp8 register variant fed by TMA) on the current
// device: 0 where it cannot run (not an sm_90 device, or the library's image is not sm_90a).
template <typename Elem>
int query_major_regs_tma_ctas_per_sm() {
  using Cfg = QueryMajorConfig<Elem, KvKind::kFp8, 1, true>;
  return flashmsa::cuda::prepare_sm90a_launch(
      query_major_kernel<Elem, KvKind::kFp8, 1, true, false, false, false, true>, kQmThreads,
      size_t(Cfg::kSmemBytes));
}

// split=cluster: the largest cluster (in CTAs, 0 where clusters cannot run) that every split=cluster
// kernel of this compute dtype and KV kind the planner may pick gets on the current device.
template <typename Elem, KvKind kKv>
int query_major_cluster_max(bool regs) {
  auto size = [&]<int kWarpsM, bool kRegs, bool kWordCvt = false>() {
    using Cfg = QueryMajorConfig<Elem, kKv, kWarpsM, kRegs>;
    return flashmsa::cuda::prepare_cluster_launch(
        query_major_kernel<Elem, kKv, kWarpsM, kRegs, false, kWordCvt, true>, kQmThreads,
        QueryMajorClusterLayout<Cfg>::kSmemBytes);
  };
  int n = std::min(size.template operator()<1, false>(), size.template operator()<4, false>());
  if (regs) n = std::min(n, size.template operator()<1, true>());
  if constexpr (kKv == KvKind::kNvfp4) {  // and its word conversion (nvfp4_cvt=word, auto)
    if (regs) n = std::min(n, size.template operator()<1, true, true>());
  }
  return n;
}

}  // namespace flashmsa::sparse_attn
