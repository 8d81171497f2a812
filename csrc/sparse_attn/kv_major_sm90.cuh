// KV-major sparse attention on Hopper (sm_90a): the same schedule, lists, items and partials as
// kv_major.cuh, with the block's attention done by warpgroup MMAs.
//
// A CTA is four warpgroups (512 threads, 128 registers), one per SM. Per item it loads the
// 128-key K and V block into 128-byte-swizzled tiles (dequantizing fp8 / NVFP4 through the idle
// query area) and the item's list entries into shared memory; then each warpgroup streams every
// fourth 64-row query tile of the item (rows = (token, head) pairs) through the block, with a
// 2-stage query ring per warpgroup. Per tile and warpgroup:
//   S = Q K^T          8 x wgmma m64n128k16, Q and K from shared memory; while they run, each
//                      warp builds its 16 rows' tables of the next tile and gathers their query
//                      rows by cp.async (no warpgroup barrier: a warp only reads its own rows)
//   P = 2^(S scale log2e - m)   one softmax over the block's 128 keys (no running rescale: a
//                      partial covers exactly one block), masked by each row's causal limit, both
//                      rows of a thread in one pass
//   O = P V            8 x wgmma m64n128k16, P from registers (the S accumulator layout is the A
//                      fragment layout), V read MN-major from the same tile layout as K; while they
//                      run, the row LSEs are written
// and writes O / l (compute dtype: stmatrix into the consumed query buffer, then two TMA stores
// per warp where G % 16 == 0, kv_major_store=tma, else predicated 16-byte stores) as the row's
// partial, exactly where kv_major.cuh writes it, with its LSE (log2 and 1 / l by MUFU
// approximations unless kv_major_math=precise); the combine kernel is shared. Each output row
// depends only on its own query row and the block (row-independent MMAs, a softmax reduced in a
// fixed order), so results are deterministic (D11).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "common/cuda_utils.h"
#include "common/group_div.h"
#include "common/tensor_map.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "flashmsa/error.h"
#include "sparse_attn/attention_core.cuh"
#include "sparse_attn/kv_major.cuh"
#include "sparse_attn/wgmma_tile.cuh"

namespace flashmsa::sparse_attn {

template <KvKind kKv>
struct KvMajorSm90Config {
  static constexpr int kWarpgroups = 4;  // consumers of one K/V block, each with its own query ring
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kTileRows = 64;   // query rows per wgmma tile
  static constexpr int kStages = 2;      // query ring per warpgroup: 1 tile in flight
  static constexpr int kKvTileBytes = kBlockSize * 256;  // K or V of one block, compute dtype
  static constexpr int kQTileBytes = kTileRows * 256;
  static constexpr int kRawBytes = 2 * kRawTileBytes<kKv, kBlockSize>;
  static constexpr int kQAreaBytes = kWarpgroups * kStages * kQTileBytes;
  // wgmma operands must be 1024-byte aligned (128-byte swizzle atoms): K, V, Q buffers are.
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKvTileBytes;
  static constexpr int kQOffset = kVOffset + kKvTileBytes;
  // Row tables per (warpgroup, stage): query byte offset, partial index (int64), visible keys
  // (kvm90_build_rows: each in the order its reader wants).
  static constexpr int kTables = kWarpgroups * kStages;
  static constexpr int kRowQOffset = kQOffset + kQAreaBytes;
  static constexpr int kRowSlotOffset = kRowQOffset + kTables * kTileRows * 8;
  static constexpr int kRowLimOffset = kRowSlotOffset + kTables * kTileRows * 8;
  // The item's list entries (the plan caps items at kKvm90MaxTokensPerItem tokens).
  static constexpr int kListOffset = kRowLimOffset + kTables * kTileRows * 4;
  // Two item records, used alternately (see the item loop).
  static constexpr int kItemOffset = kListOffset + kKvm90MaxTokensPerItem * 4;
  static constexpr int kSmemBytes = kItemOffset + 2 * 128;
  static_assert(kQTileBytes % 1024 == 0 && kKvTileBytes % 1024 == 0, "1024-byte aligned tiles");
  static_assert(kRawBytes <= kQAreaBytes, "raw K/V staging fits the query area");
};

#if MSA_HAS_WGMMA
// Row tables of one 64-row tile. Each warp builds, reads and stores the 16 rows of its own m16
// slice (rows 16 w .. 16 w + 15 of the tile: its wgmma rows), so no table needs more than a
// __syncwarp; per row:
//   q     byte offset of the row's query vector (padding rows, past the item's end, read row 0 of
//         q: their scores are masked away, lim 0 so P = 0, and they are never stored, so no copy
//         needs a zero-fill),
//   slot  partial index (-1 for padding rows),
//   lim   visible keys of the block (0 for padding rows).
// q and slot sit at kvm90_row_index(i): within a warp's 16 rows, row 2 j + c at 8 c + j, so that
// the lane gathering or storing rows c, c + 2, ..., c + 14 reads its 8 entries with 4 16-byte
// loads; lim sits in row order.
MSA_DEVICE int kvm90_row_index(int i) { return (i & ~15) | ((i & 1) << 3) | ((i & 15) >> 1); }

static_assert(kKvm90MaxTokensPerItem <= kGroupDivMaxRowsPerG, "group_div covers an item's rows");

// Lanes 0-15 of warp w fill the tables of rows 16 w + lane of local tile `tile` (-1: past the
// item's end, every row padding).
template <typename Elem>
MSA_DEVICE void kvm90_build_rows(const KvMajorArgs& args, const KvmItemState& is, const uint32_t* s_list,
                                 int tile, int64_t* s_q, int64_t* s_slot, int* s_lim, int warp, int lane,
                                 uint32_t g_magic) {
  if (lane >= 16) return;
  const SparseAttnParams& p = args.p;
  const int G = args.group;
  const int row = 16 * warp + lane;
  const int i = tile * 64 + row;
  int64_t qb = 0, slot_idx = -1;
  int lim = 0;
  if (tile >= 0 && i < is.rows) {
    const int e = group_div(i, G, g_magic);  // common/group_div.h
    const int g = i - e * G;
    const uint32_t v = s_list[e];
    const int rel = int(v >> 6), slot = int(v & 63u);
    // The item's parts precomputed (KvmItemState): the row adds its own.
    qb = (is.q_item + int64_t(rel) * p.q_stride_token + int64_t(g) * p.q_stride_head) * int64_t(sizeof(Elem));
    slot_idx = is.slot_item + int64_t(rel * p.topk + slot) * G + g;
    lim = min(max(is.lim_base + rel, 0), is.lim_cap);
  }
  s_q[kvm90_row_index(row)] = qb;
  s_slot[kvm90_row_index(row)] = slot_idx;
  s_lim[row] = lim;
}

// cp.async of a warp's 16 rows of one 64-row query tile (Sw128Tile<64> at `tile`), committed as
// one group (an empty group for a tile past the item's end). Lane t copies the 16-byte chunk
// ch = t % 16 of the warp's rows c + 2 j (c = t / 16, j < 8): its source is q + 16 ch bytes + the
// row's offset; its destination at(16 w + c + 2 j, ch) = dst + 256 j + ((x ^ (2 j % 8)) << 4),
// with dst = at(16 w + c, 0 or 8 for the half) and x = (ch % 8) ^ c (the row's % 8 is
// c ^ (2 j % 8)). (Derived here from the lane, not kept in registers across the tile loop.)
MSA_DEVICE void kvm90_issue_q(bool live, const void* q, const int64_t* s_q_warp, uint32_t tile, int warp, int lane) {
  if (live) {
    const int ch = lane & 15, c = lane >> 4;
    const uint8_t* q_ch = static_cast<const uint8_t*>(q) + 16 * ch;
    const uint32_t dst = tile + uint32_t(ch >> 3) * (64 * 128) + uint32_t(16 * warp + c) * 128u;
    const uint32_t x = uint32_t((ch & 7) ^ c);
    const longlong2* t = reinterpret_cast<const longlong2*>(s_q_warp + 8 * c);
    longlong2 off[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) off[k] = t[k];  // the loads first: one wait, not one per copy
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t o = (j & 1) ? off[j >> 1].y : off[j >> 1].x;
      cp_async_16(dst + 256u * uint32_t(j) + ((x ^ uint32_t((2 * j) & 7)) << 4), q_ch + o);
    }
  }
  cp_async_commit();
}

// The warp's 16 rows of O * mul as partials: stmatrix into the warp's own rows of the consumed
// query tile `tile` (Sw128Tile<64>: chunk ch of row r of the warp at (ch / 8) * 8 KB +
// (16 warp + r) * 128 + ((ch % 8) ^ (r % 8)) * 16, the bytes its own query row held), then lane t
// copies chunk t % 16 of rows t / 16 + 2 j (j < 8) to the rows' partials: all 8 chunks and slots
// loaded first, then 8 predicated 16-byte stores (none for a padding row). No other warp reads or
// writes those bytes until the next round's barrier: a warp's part of S = Q K^T reads only its own
// query rows (and the warp is past its S wait), so no warpgroup barrier precedes the writes.
// `slots` is the warp's part of the slot table (kvm90_row_index order).
template <typename Elem>
MSA_DEVICE void kvm90_stage_partials(const float (&o)[16][4], const float (&mul)[2], uint8_t* tile, int warp,
                                     int lane) {
  uint8_t* rows = tile + warp * 16 * 128;  // the warp's row 0 in the first 64-dim half
  {
    // stmatrix matrices 0..3: (rows 0-7, n8 tile 2c), (rows 8-15, 2c), (rows 0-7, 2c + 1),
    // (rows 8-15, 2c + 1); lane t addresses row t % 8 of matrix t / 8. Chunk k = 2c + t / 16 of
    // row r sits in half k / 8 = c / 4 at chunk (k % 8) ^ (r % 8) = (2 (c % 4)) ^ x.
    const int r = (lane & 7) | (lane & 8);
    const uint32_t x = uint32_t((lane >> 4) ^ (r & 7));
    const uint32_t base = smem_addr(rows) + uint32_t(r) * 128u;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      stmatrix_x4(base + uint32_t(c >> 2) * (64u * 128u) + ((uint32_t(2 * (c & 3)) ^ x) << 4),
                  pack2_partial<Elem>(o[2 * c][0] * mul[0], o[2 * c][1] * mul[0]),
                  pack2_partial<Elem>(o[2 * c][2] * mul[1], o[2 * c][3] * mul[1]),
                  pack2_partial<Elem>(o[2 * c + 1][0] * mul[0], o[2 * c + 1][1] * mul[0]),
                  pack2_partial<Elem>(o[2 * c + 1][2] * mul[1], o[2 * c + 1][3] * mul[1]));
    }
  }
}

template <typename Elem>
MSA_DEVICE void kvm90_store_partials(const float (&o)[16][4], const float (&mul)[2], uint8_t* tile, int warp,
                                     void* part_o, const int64_t* slots, int lane) {
  kvm90_stage_partials<Elem>(o, mul, tile, warp, lane);
  uint8_t* rows = tile + warp * 16 * 128;
  __syncwarp();
  const int ch = lane & 15, c0 = lane >> 4;
  const longlong2* t = reinterpret_cast<const longlong2*>(slots + 8 * c0);
  longlong2 sl[4];
  uint4 v[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) sl[k] = t[k];
  const uint8_t* src = rows + (ch >> 3) * (64 * 128);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int r = c0 + 2 * j;
    v[j] = *reinterpret_cast<const uint4*>(src + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
  }
  uint8_t* dst = static_cast<uint8_t*>(part_o) + 16 * ch;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t slot = (j & 1) ? sl[j >> 1].y : sl[j >> 1].x;
    st_global_16_if(dst + slot * 256, v[j], slot >= 0);
  }
  __syncwarp();
}

// Softmax of both fragment rows of this thread (h = 0: row gid, 1: gid + 8 of the warp's 16) over
// one block's 128 keys, in base 2: x = S * sc (sc = scale * log2 e), m = max x over the visible
// keys (taken on the raw scores: max x = |sc| * max(S * sign(sc)), 0 when nothing is visible),
// P = 2^(x - m) = 2^fma(S, sc, -m) left in s, 0 for keys >= lim (kMask: only rows of the diagonal
// block have any; with lim >= 128 the masked form gives the same values). l = sum P and
// lt = sum 2^(T (x - m)) are reduced over each row's 4 threads. The two rows go through one
// basic block, so their dependent chains (max, the shuffles, the sums) interleave; each row's sum
// keeps its key order.
template <bool kMask, bool kTemp>
MSA_DEVICE void block_softmax_rows(float (&s)[16][4], const int (&lim)[2], float sc, float temp, int tig,
                                   float (&m)[2], float (&l)[2], float (&lt)[2]) {
  float ext[2];
  rows_extreme<kMask>(s, lim, sc, tig, ext);
#pragma unroll
  for (int h = 0; h < 2; ++h) m[h] = ext[h] == neg_inf() ? 0.0f : ext[h] * fabsf(sc);
  float sum[2] = {0.0f, 0.0f}, sum_t[2] = {0.0f, 0.0f};
  rows_exp_sum<kMask, kTemp>(s, lim, sc, temp, tig, m, sum, sum_t);
#pragma unroll
  for (int k = 1; k <= 2; k <<= 1)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], k);
      if constexpr (kTemp) sum_t[h] += __shfl_xor_sync(0xffffffffu, sum_t[h], k);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = sum[h];
    lt[h] = sum_t[h];
  }
}

// block_softmax_rows with the variant chosen once per thread (uniform per warp for G >= 16: a
// warp's rows are one token's heads).
MSA_DEVICE void kvm90_softmax(float (&s)[16][4], const int (&lim)[2], bool has_temp, float sc, float temp, int tig,
                              float (&m)[2], float (&l)[2], float (&lt)[2]) {
  with_softmax_variant(lim, has_temp, [&](auto mask, auto tmp) {
    block_softmax_rows<decltype(mask)::value, decltype(tmp)::value>(s, lim, sc, temp, tig, m, l, lt);
  });
}
#endif

// The kernel's parameters: the KV-major arguments and, for kv_major_store=tma (kTmaStore), the
// tensor map of the partials (common/tensor_map.h; zero and unused otherwise).
struct KvMajorSm90Args {
  CUtensorMap o_map;  // part_o as (128 dims, Hkv * chunk_rows * topk * G rows), box (64, 16), 128-byte swizzle
  KvMajorArgs a;
};

// kTmaStore (plan option kv_major_store=tma; G a multiple of 16, so that a warp's 16 rows are 16
// consecutive partial rows of one token, or all padding): the epilogue's staged tile goes out as
// two TMA stores per warp (one per 64-dim half) from the warp's rows of the consumed query tile,
// instead of each lane's loads and 8 predicated 16-byte stores. The stage is refilled by the warp's
// gather of the tile after next, after its lane 0 has waited for the store's reads
// (bulk_wait_read); so is the query area, which quantized K/V stage through at the next item.
template <typename Elem, KvKind kKv, bool kTmaStore>
__global__ void __launch_bounds__(KvMajorSm90Config<kKv>::kThreads, 1)
    kv_major_sm90_kernel(const __grid_constant__ KvMajorSm90Args ka) {
#if MSA_HAS_WGMMA
  using Cfg = KvMajorSm90Config<kKv>;
  constexpr int S = Cfg::kStages;
  extern __shared__ __align__(1024) uint8_t smem[];
  const KvMajorArgs& args = ka.a;
  const SparseAttnParams& p = args.p;
  // wg broadcast from lane 0: warp-uniform for the compiler too, so the wgmma descriptors of this
  // warpgroup's query tiles live in uniform registers (one add per k-step, no moves per wgmma).
  const int tid = threadIdx.x, wg = __shfl_sync(0xFFFFFFFFu, tid >> 7, 0), wtid = tid & 127;
  const int lane = tid & 31, warp = wtid >> 5;  // warp within the warpgroup
  const int gid = lane >> 2, tig = lane & 3;
  KvmItemState* s_state = reinterpret_cast<KvmItemState*>(smem + Cfg::kItemOffset);
  uint32_t* s_list = reinterpret_cast<uint32_t*>(smem + Cfg::kListOffset);
  int64_t* s_rowq = reinterpret_cast<int64_t*>(smem + Cfg::kRowQOffset) + wg * S * 64;
  int64_t* s_rowslot = reinterpret_cast<int64_t*>(smem + Cfg::kRowSlotOffset) + wg * S * 64;
  int* s_rowlim = reinterpret_cast<int*>(smem + Cfg::kRowLimOffset) + wg * S * 64;
  uint8_t* sK = smem + Cfg::kKOffset;
  uint8_t* sV = smem + Cfg::kVOffset;
  uint8_t* s_qarea = smem + Cfg::kQOffset;
  uint8_t* my_q = s_qarea + wg * S * Cfg::kQTileBytes;
  const uint32_t sK_addr = smem_addr(sK), sV_addr = smem_addr(sV), sQ_addr = smem_addr(s_qarea);
  const uint32_t my_q_addr = smem_addr(my_q);
  const uint32_t g_magic = group_div_magic(args.group);
  const float temp = p.lse_temperature;
  check_smem_base(smem);

  // Item records alternate: item k + 1's is fetched into the slot item k does not use during item
  // k's last round, by the first thread of the last warpgroup (the one with the fewest tiles:
  // often idle then) after its round's MMAs or gathers are issued, so that the work counter's and
  // the record's round trips no longer start each item; the barrier that ends item k publishes
  // it. The write is a CTA barrier (the one after item k's list load) away from item k - 1's last
  // read of that slot. Fetching in the last round rather than at the item's start keeps the item
  // taken from the counter only shortly before it is needed (the tail of a launch group stays
  // balanced). (The racecheck reports on the record were the warpgroups' unequal barrier counts,
  // not the record: see the rounds below.)
  if (tid == 0) s_state[0] = fetch_kvm_item(args);
  __syncthreads();
#pragma unroll 1
  for (int parity = 0;; parity ^= 1) {
    // Read from shared memory where used (registers go to the accumulators).
    const KvmItemState& is = s_state[parity];
    if (is.kh < 0) break;

    // K / V block: native straight into the tiles (its cp.async group completes no later than the
    // first query tile's; round 0's CTA barrier publishes every thread's part of it); quantized
    // through the query area, dequantized before any query tile
    // is loaded. The item's list entries go to shared memory, so that building a tile's row table
    // never waits on global memory.
    {
      const int n_valid = min(kBlockSize, is.seqlen_k - is.j0);
      const int64_t k_off = kv_offset(p.k, p.kv, is.b, is.kh, is.j0);
      const int64_t v_off = kv_offset(p.v, p.kv, is.b, is.kh, is.j0);
      const int64_t srow = kKv == KvKind::kNvfp4 ? kv_scale_row(p.kv, p.num_kv_heads, is.b, is.kh, is.j0) : 0;
      const int step = scale_row_step(p);
      constexpr int T = Cfg::kThreads;
      if constexpr (kKv == KvKind::kNative) {
        issue_kv_rows<Elem, kKv, kBlockSize, T, Sw128Tile<kBlockSize>>(p.k, k_off, srow, step, n_valid, sK_addr, tid);
        issue_kv_rows<Elem, kKv, kBlockSize, T, Sw128Tile<kBlockSize>>(p.v, v_off, srow, step, n_valid, sV_addr, tid);
        cp_async_commit();
      } else {
        constexpr int kRawTile = kRawTileBytes<kKv, kBlockSize>;
        issue_kv_rows<Elem, kKv, kBlockSize, T>(p.k, k_off, srow, step, n_valid, sQ_addr, tid);
        issue_kv_rows<Elem, kKv, kBlockSize, T>(p.v, v_off, srow, step, n_valid, sQ_addr + kRawTile, tid);
        cp_async_commit();
      }
      const int tokens = is.rows / args.group;
      for (int e = tid; e < tokens; e += T) s_list[e] = args.list[is.start + e];
      if constexpr (kKv != KvKind::kNative) {
        constexpr int kRawTile = kRawTileBytes<kKv, kBlockSize>;
        cp_async_wait<0>();
        __syncthreads();
        convert_kv_rows<Elem, kKv, kBlockSize, T, Sw128Tile<kBlockSize>>(s_qarea, sK, tid);
        convert_kv_rows<Elem, kKv, kBlockSize, T, Sw128Tile<kBlockSize>>(s_qarea + kRawTile, sV, tid);
      }
      __syncthreads();  // the list is visible; raw bytes consumed before query tiles overwrite them
    }

    // Warpgroup wg takes tiles wg, wg + 4, ...: local tile i is tile wg + 4 i, in stage i % S.
    const int n_tiles = (is.rows + Cfg::kTileRows - 1) / Cfg::kTileRows;
    const int my_tiles = n_tiles > wg ? (n_tiles - wg + Cfg::kWarpgroups - 1) / Cfg::kWarpgroups : 0;
    // Row tables and query loads of this warp's rows of local tile i (an empty group past the
    // end). Stage i % S was last used by local tile i - S, whose epilogue every warp of the
    // warpgroup finished before the barrier that began round i - S + 1; the tables and query rows a
    // warp writes are its own (no other warp reads them), so a __syncwarp publishes the tables.
    auto prefetch = [&](int i) {
      const int st = i % S;
      const int tile = i < my_tiles ? wg + Cfg::kWarpgroups * i : -1;
      kvm90_build_rows<Elem>(args, is, s_list, tile, s_rowq + st * 64, s_rowslot + st * 64, s_rowlim + st * 64,
                             warp, lane, g_magic);
      if constexpr (kTmaStore) {
        // Stage st was last stored from by this warp's tile i - S: its reads done before the gather.
        if (lane == 0) bulk_wait_read<0>();
      }
      __syncwarp();
      kvm90_issue_q(i < my_tiles, p.q, s_rowq + st * 64 + 16 * warp, my_q_addr + st * Cfg::kQTileBytes, warp,
                    lane);
    };
    static_assert(S == 2, "one gather in flight: tile i + 1's, issued while tile i's S = Q K^T runs");
    prefetch(0);

    // Every warpgroup runs the same number of rounds, the last one idle where it has a tile less:
    // the warpgroups then pass the same number of barriers per item (one per round). compute-
    // sanitizer's racecheck needs that: with unequal counts it reports hazards between the item
    // record's write and the reads of an earlier item although __syncthreads orders every one of
    // them (the model of this loop in scripts/racecheck_model.cu shows the reports with unequal
    // rounds, none with equal).
    const int rounds = (n_tiles + Cfg::kWarpgroups - 1) / Cfg::kWarpgroups;
#pragma unroll 1
    for (int i = 0; i < rounds; ++i) {
      const int st = i % S;
      cp_async_wait<0>();        // this thread's copies of tile i (and of the K/V block) landed
      fence_proxy_async_smem();  // generic-proxy writes -> wgmma operand reads
      // Round 0 waits for the whole CTA: the K / V block was copied (native) or dequantized (fp8 /
      // NVFP4) by all 512 threads, and a warpgroup's S = Q K^T and P V read all of it, so a
      // warpgroup barrier let a warpgroup's first MMA read K rows another warpgroup's copies had
      // not landed yet (the previous item's rows: rare run-to-run differences in the KV-major
      // schedule, test_kv_major_prefill_deterministic_repeated at 2d277ce on the H200). Every
      // warpgroup runs every round (idle ones included), so all threads reach it.
      if (i == 0) {
        __syncthreads();
      } else {
        warpgroup_barrier(wg);
      }
      const bool fetch_next = i == rounds - 1 && tid == Cfg::kThreads - 128;
      if (i >= my_tiles) {  // idle round: the next (empty) prefetch
        prefetch(i + 1);
        if (fetch_next) s_state[parity ^ 1] = fetch_kvm_item(args);
        continue;
      }

      // S = Q K^T in flight while this warpgroup builds and gathers its next tile.
      float s[16][4];
      wgmma_qk_issue<Elem>(s, my_q_addr + st * Cfg::kQTileBytes, sK_addr);
      prefetch(i + 1);
      if (fetch_next) s_state[parity ^ 1] = fetch_kvm_item(args);
      wgmma_wait<0>();
      wgmma_fence_operand(s);

      // Softmax over the block's keys for this thread's rows r_h = 16 warp + gid + 8 h.
      const int* lims = s_rowlim + st * 64;
      const int lim[2] = {lims[16 * warp + gid], lims[16 * warp + gid + 8]};
      float m_row[2], l_row[2], lt_row[2];
      kvm90_softmax(s, lim, args.has_temp, args.scale_log2, temp, tig, m_row, l_row, lt_row);

      // O = P V in flight while the row LSEs go out.
      float o[16][4];
      {
        uint32_t pa[8][4];
        pack_p<Elem>(pa, s);
        wgmma_pv_issue<Elem>(o, pa, sV_addr, false);
      }
      const int64_t* slots = s_rowslot + st * 64;
      // approx_row_math (kv_major_math=approx): the LSE's log2 and 1 / l by MUFU.LG2 / MUFU.RCP;
      // else log2f and __frcp_rn, the correctly rounded 1 / l, as the division is (without its slow
      // path). Both -inf / 0 for a row with nothing visible (l = 0).
      const bool approx = args.approx_row_math;
      if (tig < 2) {  // every thread of a row holds its m and l: lane tig writes row h = tig
        const int64_t sl = slots[kvm90_row_index(16 * warp + gid + 8 * tig)];
        if (sl >= 0) {
          const float m = tig ? m_row[1] : m_row[0], l = tig ? l_row[1] : l_row[0];
          args.part_lse[sl] = row_lse2(m, l, approx);
          if (args.part_lse_t != nullptr)
            args.part_lse_t[sl] = row_lse2_t(m, tig ? lt_row[1] : lt_row[0], temp, approx);
        }
      }
      float mul[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        mul[h] = l_row[h] > 0.0f ? (approx ? rcp_approx(l_row[h]) : __frcp_rn(l_row[h])) : 0.0f;
      wgmma_wait<0>();
      wgmma_fence_operand(o);
      // Epilogue: warp w's 16 rows through its own rows of the consumed query buffer. The next
      // write into stage st is this warp's own gather of local tile i + S, issued after the next
      // round's barrier, which every warp of the warpgroup reaches only past this epilogue.
      if constexpr (kTmaStore) {
        kvm90_stage_partials<Elem>(o, mul, my_q + st * Cfg::kQTileBytes, warp, lane);
        fence_proxy_async_smem();  // each lane's stmatrix -> the TMA store (async proxy)
        __syncwarp();
        const int64_t slot0 = slots[kvm90_row_index(16 * warp)];  // the warp's first row (g % 16 == 0)
        if (lane == 0 && slot0 >= 0) {
          const uint32_t src = my_q_addr + uint32_t(st * Cfg::kQTileBytes + warp * 16 * 128);
          tma_store_2d(&ka.o_map, src, 0, int(slot0));
          tma_store_2d(&ka.o_map, src + 64 * 128, 64, int(slot0));
          bulk_commit();
        }
      } else {
        kvm90_store_partials<Elem>(o, mul, my_q + st * Cfg::kQTileBytes, warp, args.part_o, slots + 16 * warp,
                                   lane);
      }
    }
    cp_async_wait<0>();  // the empty groups past the end
    if constexpr (kTmaStore) {
      // The query area is the next item's raw K/V staging (fp8 / NVFP4) and query ring.
      if (lane == 0) bulk_wait_read<0>();
    }
    __syncthreads();     // the block, the list and the item record are reused by the next item
  }
  if constexpr (kTmaStore) {
    if (lane == 0) bulk_wait<0>();  // this warp's partial stores complete before the CTA exits
  }
#else
  __trap();  // launched only on sm_90 devices, where the sm_90a image is chosen
#endif
}

// CTAs of the sm_90a kernel resident per SM, 0 when this device cannot run it.
template <typename Elem, KvKind kKv>
int kv_major_sm90_ctas_per_sm() {
  return flashmsa::cuda::prepare_sm90a_launch(kv_major_sm90_kernel<Elem, kKv, false>,
                                              KvMajorSm90Config<kKv>::kThreads,
                                              size_t(KvMajorSm90Config<kKv>::kSmemBytes));
}

template <typename Elem, KvKind kKv, bool kTmaStore>
void launch_kv_major_sm90_variant(const KvMajorSm90Args& ka, int grid, cudaStream_t stream) {
  constexpr int smem = KvMajorSm90Config<kKv>::kSmemBytes;
  constexpr int threads = KvMajorSm90Config<kKv>::kThreads;
  auto* kernel = kv_major_sm90_kernel<Elem, kKv, kTmaStore>;
  flashmsa::cuda::prepare_launch(kernel, threads, size_t(smem));
  kernel<<<grid, threads, smem, stream>>>(ka);
}

// The partials of a launch group as a TMA tensor map (both TMA-store kernels' layout): 128 dims of
// the compute dtype by Hkv x chunk_rows x topk x G rows of 256 bytes, boxes of 64 dims x box_rows
// rows, 128-byte swizzle. False where the driver rejects it.
template <typename Elem>
bool encode_partial_map(CUtensorMap& map, const KvMajorArgs& args, uint32_t box_rows) {
  const SparseAttnParams& p = args.p;
  const uint64_t dims[2] = {128, uint64_t(p.num_kv_heads) * args.chunk_rows * p.topk * args.group};
  const uint64_t strides[1] = {256};
  const uint32_t box[2] = {64, box_rows};
  return flashmsa::cuda::encode_tensor_map_sw128(map, flashmsa::cuda::tma_dtype_16<Elem>(), args.part_o, 2, dims,
                                                 strides, box);
}

// tma_store (KvMajorPlan): the kTmaStore kernel with the partials' tensor map (NotSupported where
// the driver rejects it; the planner sends only G % 16 == 0 and partial rows within TMA's 32-bit
// coordinates).
template <typename Elem, KvKind kKv>
void launch_kv_major_sm90(const KvMajorArgs& args, int grid, bool tma_store, cudaStream_t stream) {
  KvMajorSm90Args ka{};
  ka.a = args;
  if (tma_store) {
    MSA_CHECK_SUPPORTED(encode_partial_map<Elem>(ka.o_map, args, 16),
                        "kv_major_store=tma: the driver rejected the partials' TMA descriptor");
    launch_kv_major_sm90_variant<Elem, kKv, true>(ka, grid, stream);
  } else {
    launch_kv_major_sm90_variant<Elem, kKv, false>(ka, grid, stream);
  }
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn
