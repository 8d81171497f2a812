// MTP union items on Hopper (sm_90a) with TMA loads and warpgroup MMAs: the decode plan option
// kernel=wgmma (bf16 / fp16 q, K and V of the compute dtype). Same items, plan, splits, partials,
// combine and outputs as the query-major union items (query_major.cuh, plan_mtp_item): item =
// (request b, kv head kh, split s), rows = the request's n_tok tokens x G heads (token-major,
// n_tok x G <= 64: one wgmma m64 tile; M3 at 4 tokens: exactly 64 rows), blocks = split s's share
// of the union of the tokens' selections (mtp_union_entries), each with its per-token visible key
// counts. docs/design/sparse_attention.md "MTP union items on warpgroup MMAs" has the cost model.
//
// Persistent CTAs (a grid of at most one per SM, items blockIdx.x, + gridDim.x, ...) of two
// warpgroups, warp-specialized as union_tma_sm90.cuh (read it first):
//   producer   one warp (the other three of its warpgroup leave at once). Per item, into one of two
//              item buffers: the union plan (mtp_union_entries: block ids and per-token counts,
//              written by the lanes that found them), Q (one 3-D box per 64-dim half: G heads x
//              n_tok tokens at the request's first row); then each block's K and V through a
//              3-stage ring of [2][128][64] 128-byte-swizzled tiles (tma_load_kv_block), completing
//              on the slots' "full" mbarriers. A block whose largest count is below 128 keys has
//              its V rows from there on zeroed before it is published (what the smem union kernel's
//              zero-filled loads give; P = 0 times a NaN there would be NaN). It runs ahead into
//              the next item: the ring never drains between items.
//   consumer   one warpgroup (128 threads), all 64 rows: S_u = Q K_u^T and O += P_{u-1} V_{u-1}
//              both in flight, the masked online softmax of block u (row of token t: the first
//              count_t keys; the union kernels' lazy rescale) while P V runs, P_u kept in registers
//              (union_tma_sm90.cuh's intra-warpgroup overlap). Then out = O * v_global_scale / l
//              and the LSEs, or the split's partial and log2 LSEs, as the query-major kernel writes
//              them; 16-bit and fp8 outputs are staged through the consumed Q tile, fp32 partials
//              are stored from the fragments (32 bytes per row and store: whole sectors).
// A row of a token that did not select a block is masked (P = 0) rather than skipped, so a
// non-finite V value in a block only another token of the request selected would reach it (as in
// the fp8 union register kernel); finite V never does. Registers: one CTA of 256 threads per SM
// leaves the consumers up to 255 without setmaxnreg.
//
// wgmma_fp8=on (kFp8, with the ahead pipe): fp8 e4m3 K/V, computed in fp16. The loader copies each
// block's raw K or V (16 KB) into the upper half of its stage of the 16-bit kernel's 3-stage K / V
// rings; a third warpgroup of 4 converter warps (K and V, two halves of the keys each) converts it
// exactly into the stage's fp16 tile in place (one cvt per e4m3 pair; V keys past the block's
// largest count written as zeros, so no v_fix; MtpWgmmaFp8Config). The consumers run the fp16
// kernel's MMAs and softmax on them: fp16 q as it is (bit for bit the 16-bit kernel on the
// dequantized K/V), bf16 q converted in place to fp16 once per item, times 2^(14 - E) for E the
// exponent of the item's largest finite |q| (mtp_fp8_q_to_f16; the logits are multiplied back by
// 2^(E - 14) in the softmax scale), P rounded to fp16. docs/design/sparse_attention.md "fp8 K/V on
// the MTP wgmma kernel".
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>

#include "common/cuda_utils.h"
#include "common/mbarrier.cuh"
#include "common/tensor_map.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "flashmsa/error.h"
#include "sparse_attn/query_major.cuh"
#include "sparse_attn/union_tma_sm90.cuh"

namespace flashmsa::sparse_attn {

struct MtpWgmmaArgs {
  CUtensorMap q_map;  // q as (128 dims, Hq, total_q), box (64, G, mtp_tokens)
  CUtensorMap k_map;  // common/tensor_map.h encode_kv_block_map, box0 64
  CUtensorMap v_map;
  QueryMajorArgs a;
};

// One item as the producer planned it (an item buffer).
struct MtpWgmmaPlan {
  int none;  // 1: no work left
  int kh, r0, n_tok, split, count;
  int pad[2];
  uint32_t counts[kMaxTopk];  // per union block of the split: byte t = keys token t sees
  int block[kMaxTopk];        // the blocks (producer only)
};

struct MtpWgmmaConfig {
  static constexpr int kConsumerThreads = 128;  // one warpgroup
  static constexpr int kThreads = 256;          // + the producer warpgroup (one warp works)
  static constexpr int kItemBufs = 2;
  static constexpr int kStages = 3;  // K / V ring
  static constexpr int kQBytes = 64 * 256;
  static constexpr int kKvBytes = kBlockSize * 256;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kItemBufs * kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKvBytes;
  static constexpr int kPlanOffset = kVOffset + kStages * kKvBytes;
  static constexpr int kPlanBytes = (int(sizeof(MtpWgmmaPlan)) + 15) / 16 * 16;
  // mbarriers: q_full[2], q_empty[2], k_full[3], k_empty[3], v_full[3], v_empty[3], v_fix
  static constexpr int kBarOffset = kPlanOffset + kItemBufs * kPlanBytes;
  static constexpr int kSmemBytes = kBarOffset + 17 * 8;
};
static_assert(MtpWgmmaConfig::kSmemBytes <= 227 * 1024, "shared memory plan exceeds the sm_90 opt-in limit");
static_assert(MtpWgmmaConfig::kKOffset % 1024 == 0 && MtpWgmmaConfig::kVOffset % 1024 == 0,
              "swizzled tiles start on 1024-byte boundaries");

// wgmma_pipe=ahead: MtpWgmmaConfig's plan, then four more mbarriers (plan_full[2], plan_empty[2]) and per item
// buffer the K / V coordinate of each union block (the page, or the flat row), written by the
// planner warp so that the loader warp reads no global memory per block.
struct MtpWgmmaAheadConfig : MtpWgmmaConfig {
  static constexpr int kCoordOffset = (kBarOffset + 21 * 8 + 15) / 16 * 16;
  static constexpr int kCoordBytes = kMaxTopk * 4;
  static constexpr int kSmemBytes = kCoordOffset + kItemBufs * kCoordBytes;
};
static_assert(MtpWgmmaAheadConfig::kSmemBytes <= 227 * 1024, "shared memory plan exceeds the sm_90 opt-in limit");

// wgmma_fp8=on (fp8 e4m3 K/V, wgmma_pipe=ahead's planner and loader): the 16-bit kernel's 3-stage
// K / V rings of [2][128][64] 128-byte-swizzled fp16 tiles; the loader TMA-loads each block's raw
// K or V ([128 keys][128 bytes], 128-byte swizzle: 16 KB) into the upper half of its stage's tile
// and the converter warps turn it into the whole tile in place (mtp_fp8_convert_tile), so three
// blocks per ring are in flight or converted ahead of the consumers as in the 16-bit kernel. Then
// the plans, MtpWgmmaBars' 21 mbarriers and 12 more (raw_full, info_empty per ring and stage), the loader's per
// stage words (the visible keys of V, -1: no work left), the ahead pipe's coordinates and the
// consumers' 4 |q| maxima (bf16 q).
struct MtpWgmmaFp8Config {
  static constexpr int kConsumerThreads = MtpWgmmaConfig::kConsumerThreads;
  // + the producer warpgroup (loader, planner) + a warpgroup of 4 converter warps, one per SM
  // sub-partition (each sub-partition converts at the rate of its own conversion unit). 65536 /
  // 384 = 168 registers at launch; setmaxnreg then 248 + 2 x 128 = 3 x 168.
  static constexpr int kThreads = 384;
  static constexpr int kConsumerRegs = 248;
  static constexpr int kOtherRegs = 128;
  static constexpr int kItemBufs = MtpWgmmaConfig::kItemBufs;
  static constexpr int kStages = MtpWgmmaConfig::kStages;  // K / V rings (RingPos)
  static constexpr int kQBytes = MtpWgmmaConfig::kQBytes;
  static constexpr int kKvBytes = MtpWgmmaConfig::kKvBytes;
  static constexpr int kRawBytes = kBlockSize * 128;
  static constexpr int kRawInTile = kKvBytes - kRawBytes;  // the raw block: the tile's upper half
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kItemBufs * kQBytes;
  static constexpr int kVOffset = kKOffset + kStages * kKvBytes;
  static constexpr int kPlanOffset = kVOffset + kStages * kKvBytes;
  static constexpr int kPlanBytes = MtpWgmmaConfig::kPlanBytes;
  static constexpr int kBarOffset = kPlanOffset + kItemBufs * kPlanBytes;
  static constexpr int kRawInfoOffset = kBarOffset + 33 * 8;
  static constexpr int kCoordOffset = (kRawInfoOffset + 2 * kStages * 4 + 15) / 16 * 16;
  static constexpr int kCoordBytes = MtpWgmmaAheadConfig::kCoordBytes;
  static constexpr int kQmaxOffset = kCoordOffset + kItemBufs * kCoordBytes;  // 4 warps' |q| maxima
  static constexpr int kSmemBytes = kQmaxOffset + 16;
};
static_assert(MtpWgmmaFp8Config::kSmemBytes <= 227 * 1024, "shared memory plan exceeds the sm_90 opt-in limit");
static_assert(MtpWgmmaFp8Config::kKOffset % 1024 == 0 && MtpWgmmaFp8Config::kVOffset % 1024 == 0 &&
                  MtpWgmmaFp8Config::kRawInTile % 1024 == 0,
              "swizzled tiles start on 1024-byte boundaries");

// mbarrier addresses of MtpWgmmaConfig's plan (plan_full, plan_empty: MtpWgmmaAheadConfig's only).
struct MtpWgmmaBars {
  uint32_t base;
  MSA_DEVICE uint32_t q_full(int i) const { return base + 8 * i; }
  MSA_DEVICE uint32_t q_empty(int i) const { return base + 16 + 8 * i; }
  MSA_DEVICE uint32_t k_full(int i) const { return base + 32 + 8 * i; }
  MSA_DEVICE uint32_t k_empty(int i) const { return base + 56 + 8 * i; }
  MSA_DEVICE uint32_t v_full(int i) const { return base + 80 + 8 * i; }
  MSA_DEVICE uint32_t v_empty(int i) const { return base + 104 + 8 * i; }
  MSA_DEVICE uint32_t v_fix() const { return base + 128; }
  MSA_DEVICE uint32_t plan_full(int i) const { return base + 136 + 8 * i; }
  // The loader's reads of item buffer i's plan and coordinates are done (32 arrivals, one per lane
  // after its own reads): the planner rewrites the buffer only then. The consumers' release of
  // the buffer (q_empty) comes later in practice, but orders the loader's reads only through the
  // TMA completions racecheck does not follow.
  MSA_DEVICE uint32_t plan_empty(int i) const { return base + 152 + 8 * i; }
  // MtpWgmmaFp8Config (ring 0: K, 1: V): a block's raw bytes landed in stage i (the loader's
  // expect_tx and TMA completion, or its plain arrival with the word -1).
  MSA_DEVICE uint32_t raw_full(int ring, int i) const { return base + 168 + 24 * ring + 8 * i; }
  // ... and the ring's converter lanes have read stage i's word (64 arrivals). The loader writes a
  // stage's next word only after the consumers released the stage, which is later; this barrier
  // states the order directly (the converters' read before the loader's next write), where the
  // chain through the consumers' arrivals is one racecheck does not follow.
  MSA_DEVICE uint32_t info_empty(int ring, int i) const { return base + 216 + 24 * ring + 8 * i; }
};

// Position in the K / V ring (3 stages in both kernels): slot and the parity of its current phase.
struct RingPos {
  int st = 0;
  uint32_t ph = 0;
  MSA_DEVICE void advance() {
    if (++st == MtpWgmmaConfig::kStages) {
      st = 0;
      ph ^= 1u;
    }
  }
};

#if MSA_HAS_WGMMA
// Item `it` of this CTA (blockIdx.x + it x gridDim.x) as one warp plans it into pl: "no work left"
// (returned, pl.none = 1 by lane 0), or the union blocks of its split (mtp_union_entries), their
// counts, and (coord != nullptr) each block's K / V coordinate (kv_block_coords' page or flat row).
// Each lane writes its own entries; the caller orders them (__syncwarp, per-lane arrivals).
struct MtpItem {
  bool none;
  int b, kh, r0, count;
};
MSA_DEVICE MtpItem mtp_wgmma_plan_item(const MtpWgmmaArgs& ta, MtpWgmmaPlan& pl, int it, int* coord, int lane) {
  const QueryMajorArgs& a = ta.a;
  const SparseAttnParams& p = a.p;
  const int64_t item = blockIdx.x + int64_t(it) * gridDim.x;
  if (item >= a.num_items) {
    if (lane == 0) pl.none = 1;
    return {true, 0, 0, 0, 0};
  }
  const int split = int(item % a.splits);
  const int64_t rest = item / a.splits;
  const int kh = int(rest % p.num_kv_heads), b = int(rest / p.num_kv_heads);
  const RowRange rr = q_rows(p.qi, p.total_q, b);
  const MtpUnionEntries ue = mtp_union_entries(a, b, kh, split, lane);
  const uint32_t lt_mask = (1u << lane) - 1u;
  const uint32_t k0 = __ballot_sync(0xffffffffu, ue.sel[0]), k1 = __ballot_sync(0xffffffffu, ue.sel[1]);
  const int64_t row0 = coord != nullptr && !p.kv.paged ? kv_row_begin(p.kv, b) : 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!ue.sel[h]) continue;
    const int idx = h == 0 ? __popc(k0 & lt_mask) : __popc(k0) + __popc(k1 & lt_mask);
    pl.block[idx] = ue.blk[h];
    pl.counts[idx] = ue.counts[h];
    if (coord != nullptr) {
      const KvBlockCoords kc = kv_block_coords(p, b, kh, ue.blk[h], row0);
      coord[idx] = p.kv.paged ? kc.c3 : kc.c2;
    }
  }
  const int U = __popc(k0) + __popc(k1);
  if (lane == 0) {
    pl.none = 0;
    pl.kh = kh;
    pl.r0 = rr.begin;
    pl.n_tok = min(rr.len, a.mtp_tokens);
    pl.split = split;
    pl.count = U;
  }
  return {false, b, kh, rr.begin, U};
}

// The three tensor maps into the TMA unit's descriptor cache (one thread).
MSA_DEVICE void mtp_wgmma_prefetch_maps(const MtpWgmmaArgs& ta) {
  tma_prefetch_map(&ta.q_map);
  tma_prefetch_map(&ta.k_map);
  tma_prefetch_map(&ta.v_map);
}

// Lane 0: Q of an item (one 3-D box per 64-dim half: G heads x mtp_tokens tokens at row r0) into
// item buffer tb, its bytes on q_full(tb) (expect_tx, an arrival).
MSA_DEVICE void mtp_wgmma_load_q(const MtpWgmmaArgs& ta, uint8_t* smem, MtpWgmmaBars bars, int tb, int kh, int r0) {
  using Cfg = MtpWgmmaConfig;
  const int G = ta.a.group;
  const uint32_t sQ = smem_addr(smem + Cfg::kQOffset + tb * Cfg::kQBytes);
  mbar_expect_tx(bars.q_full(tb), uint32_t(2 * 64 * 2 * G * ta.a.mtp_tokens));
#pragma unroll
  for (int half = 0; half < 2; ++half)
    tma_load_3d(sQ + uint32_t(half * 64 * 128), &ta.q_map, bars.q_full(tb), 64 * half, kh * G, r0);
}

// The visible keys of a block: its largest per-token count (< 128: V rows from there are zeroed).
MSA_DEVICE int mtp_block_valid(uint32_t c) {
  return int(max(max(c & 0xFFu, (c >> 8) & 0xFFu), max((c >> 16) & 0xFFu, c >> 24)));
}

// V of a block into ring slot st (lane 0 waits for the slot), published on v_full(st); a partial
// block (n_valid < 128) lands on v_fix first, the warp zeroes its rows n_valid.. and then
// publishes it (fixes: partial blocks so far, v_fix's phase).
MSA_DEVICE void mtp_wgmma_load_v(const MtpWgmmaArgs& ta, uint8_t* smem, MtpWgmmaBars bars, RingPos pos,
                                 const KvBlockCoords& kc, int n_valid, int& fixes, int lane) {
  using Cfg = MtpWgmmaConfig;
  const bool partial = n_valid < kBlockSize;
  if (lane == 0) {
    mbar_wait(bars.v_empty(pos.st), pos.ph ^ 1);
    tma_load_kv_block(ta.a.p.kv.paged, &ta.v_map, smem_addr(smem + Cfg::kVOffset + pos.st * Cfg::kKvBytes),
                      partial ? bars.v_fix() : bars.v_full(pos.st), kc);
  }
  if (partial) {
    mbar_wait(bars.v_fix(), fixes & 1);
    ++fixes;
    zero_tile_rows_from(smem + Cfg::kVOffset + pos.st * Cfg::kKvBytes, n_valid, lane);
    __syncwarp();
    if (lane == 0) mbar_arrive(bars.v_full(pos.st));
  }
}

// The producer warp (lane 0..31) of wgmma_pipe=inline: see the top of the file.
MSA_DEVICE void mtp_wgmma_producer(const MtpWgmmaArgs& ta, uint8_t* smem, MtpWgmmaBars bars, int lane) {
  using Cfg = MtpWgmmaConfig;
  const SparseAttnParams& p = ta.a.p;
  if (lane == 0) mtp_wgmma_prefetch_maps(ta);
  RingPos pos;
  int fixes = 0;  // partial blocks so far (v_fix's phase)
  for (int it = 0;; ++it) {
    const int tb = it & 1;
    mbar_wait(bars.q_empty(tb), ((it >> 1) & 1) ^ 1);
    MtpWgmmaPlan& pl = *reinterpret_cast<MtpWgmmaPlan*>(smem + Cfg::kPlanOffset + tb * Cfg::kPlanBytes);
    const MtpItem im = mtp_wgmma_plan_item(ta, pl, it, nullptr, lane);
    if (im.none) {
      mbar_arrive(bars.q_full(tb));  // every lane (the barrier counts 32): publishes "no work left"
      return;
    }
    __syncwarp();  // every lane's entries are written before any lane reads them below
    if (lane != 0) mbar_arrive(bars.q_full(tb));  // this lane's plan writes
    if (lane == 0) mtp_wgmma_load_q(ta, smem, bars, tb, im.kh, im.r0);
    const int64_t row0 = p.kv.paged ? 0 : kv_row_begin(p.kv, im.b);
#pragma unroll 1
    for (int u = 0; u < im.count; ++u, pos.advance()) {
      const int blk = pl.block[u];
      const int n_valid = mtp_block_valid(pl.counts[u]);
      KvBlockCoords kc{};  // lane 0's (the page lookup is its global load on the ring's path)
      if (lane == 0) {
        kc = kv_block_coords(p, im.b, im.kh, blk, row0);
        mbar_wait(bars.k_empty(pos.st), pos.ph ^ 1);
        tma_load_kv_block(p.kv.paged, &ta.k_map, smem_addr(smem + Cfg::kKOffset + pos.st * Cfg::kKvBytes),
                          bars.k_full(pos.st), kc);
      }
      mtp_wgmma_load_v(ta, smem, bars, pos, kc, n_valid, fixes, lane);
    }
    __syncwarp();
  }
}

// wgmma_pipe=ahead, the planner warp (lane 0..31): plans item it into item buffer it & 1 as soon
// as the consumers have released that buffer (item it - 2 done), i.e. while the loader still
// streams item it - 1's blocks; publishes the plan to the loader (plan_full) and to the consumers
// (q_full: 32 arrivals of its lanes, the 33rd is the loader's expect_tx of Q).
// Cfg: MtpWgmmaAheadConfig, or MtpWgmmaFp8Config (the same roles, other offsets).
template <typename Cfg>
MSA_DEVICE void mtp_wgmma_planner(const MtpWgmmaArgs& ta, uint8_t* smem, MtpWgmmaBars bars, int lane) {
  for (int it = 0;; ++it) {
    const int tb = it & 1;
    mbar_wait(bars.q_empty(tb), ((it >> 1) & 1) ^ 1);
    mbar_wait(bars.plan_empty(tb), ((it >> 1) & 1) ^ 1);  // the loader is done reading item it - 2
    MtpWgmmaPlan& pl = *reinterpret_cast<MtpWgmmaPlan*>(smem + Cfg::kPlanOffset + tb * Cfg::kPlanBytes);
    int* coord = reinterpret_cast<int*>(smem + Cfg::kCoordOffset + tb * Cfg::kCoordBytes);
    const MtpItem im = mtp_wgmma_plan_item(ta, pl, it, coord, lane);
    mbar_arrive(bars.plan_full(tb));  // this lane's plan writes, to the loader
    mbar_arrive(bars.q_full(tb));     // and to the consumers
    if (im.none) return;
  }
}

// wgmma_fp8=on, lane 0: a block's raw K (ring 0) or V (ring 1) bytes into the upper half of stage
// pos.st's tile once the consumers released the stage (k_empty / v_empty), with its word (the
// visible keys, what the V converters zero from; -1: no work left, no copy) released by the
// expect_tx or the plain arrival.
MSA_DEVICE void mtp_fp8_load_raw(const MtpWgmmaArgs& ta, uint8_t* smem, MtpWgmmaBars bars, int ring,
                                 RingPos pos, const KvBlockCoords& c, int info) {
  using Cfg = MtpWgmmaFp8Config;
  mbar_wait(ring == 0 ? bars.k_empty(pos.st) : bars.v_empty(pos.st), pos.ph ^ 1);
  mbar_wait(bars.info_empty(ring, pos.st), pos.ph ^ 1);  // passes at once (see MtpWgmmaBars)
  reinterpret_cast<int*>(smem + Cfg::kRawInfoOffset)[ring * Cfg::kStages + pos.st] = info;
  const uint32_t bar = bars.raw_full(ring, pos.st);
  if (info < 0) {
    mbar_arrive(bar);
    return;
  }
  const uint32_t dst =
      smem_addr(smem + (ring == 0 ? Cfg::kKOffset : Cfg::kVOffset) + pos.st * Cfg::kKvBytes + Cfg::kRawInTile);
  const CUtensorMap* map = ring == 0 ? &ta.k_map : &ta.v_map;
  mbar_expect_tx(bar, Cfg::kRawBytes);
  if (ta.a.p.kv.paged) tma_load_4d(dst, map, bar, 0, c.c1, c.c2, c.c3);
  else tma_load_3d(dst, map, bar, 0, c.c1, c.c2);
}

// A converter warp (lane 0..31), keys 64 half .. + 63 of a stage's tile: the raw [128 keys][128
// bytes] block in the tile's upper half (16-byte chunk c of key r at c ^ (r % 8)) into the whole
// [2][128][64] 128-byte-swizzled fp16 tile in place, keys n_valid.. as zeros; exact (every e4m3
// value, NaN included, is an fp16 value: one cvt per pair). Lane: raw chunk c = lane % 8 (dims 16 c
// .. + 15: half c / 4 of the tile, its chunks 2 (c % 4) and + 1) of keys 4 j + kr, kr = 2 (q / 2) +
// ((c / 4) ^ (q % 2)) for quarter-warp q = lane / 8: a quarter-warp's lanes 0-3 and 4-7 take
// adjacent keys (swizzles of opposite parity), so its 8 loads and each of its two 8-store rounds
// hit 8 distinct 16-byte bank groups without selecting data. A key's fp16 dims 64.. overwrite its
// own raw bytes: all 8 chunks of a key are read in the same batch (j) by this warp, and a batch's
// loads all come before its stores (__syncwarp between). Eight keys' loads are issued before their
// conversions (independent chains for the conversion unit).
MSA_DEVICE void mtp_fp8_convert_tile(uint8_t* tile, int n_valid, int half, int lane) {
  constexpr int kBatch = 8;
  const uint8_t* raw = tile + MtpWgmmaFp8Config::kRawInTile;
  const int c = lane & 7, q = lane >> 3, kr = 2 * (q >> 1) + ((c >> 2) ^ (q & 1)), ch = 2 * (c & 3);
  uint8_t* base = tile + (c >> 2) * (kBlockSize * 128);
#pragma unroll 1
  for (int j0 = half * (kBlockSize / 8); j0 < (half + 1) * (kBlockSize / 8); j0 += kBatch) {
    uint4 w[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int r = 4 * (j0 + i) + kr;
      w[i] = make_uint4(0u, 0u, 0u, 0u);  // e4m3 zeros: fp16 zeros
      if (r < n_valid) w[i] = *reinterpret_cast<const uint4*>(raw + r * 128 + ((c ^ (r & 7)) << 4));
    }
    __syncwarp();  // every raw chunk of these keys read before any of them is overwritten
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int r = 4 * (j0 + i) + kr, sw = r & 7;
      uint32_t v[8];
      e4m3x4_to_f16x2x2(w[i].x, v[0], v[1]);
      e4m3x4_to_f16x2x2(w[i].y, v[2], v[3]);
      e4m3x4_to_f16x2x2(w[i].z, v[4], v[5]);
      e4m3x4_to_f16x2x2(w[i].w, v[6], v[7]);
      *reinterpret_cast<uint4*>(base + r * 128 + ((ch ^ sw) << 4)) = make_uint4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<uint4*>(base + r * 128 + (((ch + 1) ^ sw) << 4)) = make_uint4(v[4], v[5], v[6], v[7]);
    }
    __syncwarp();  // this batch's stores before the next batch's loads (other keys: no overlap)
  }
}

// wgmma_fp8=on with bf16 q, the 128 consumer threads (tid 0..127): the item's Q tile (bf16, [2][64]
// [64] 128-byte swizzled as its TMA wrote it: 16-byte chunk j is a chunk of row (j / 8) % 64
// whatever the swizzle) into fp16 in place, times 2^(14 - E) for E the exponent of the largest
// finite |q| of the item's real rows (f16_row_scale: exact for every element >= 2^-28 of that
// maximum); rows from real_rows on (past the request's tokens) written as zeros. Non-finite
// elements stay what they are (inf x 2^k, NaN). qmax: 4 floats of shared memory. Returns 2^(E -
// 14), the factor of the logits. Two warpgroup barriers (warpgroup_barrier(0), id 1): the maxima
// visible, then the tile written and fenced for the wgmma (async proxy) reads.
MSA_DEVICE float mtp_fp8_q_to_f16(uint8_t* q, float* qmax, int real_rows, int tid) {
  float mx = 0.0f;
  auto fin = [](float x) { return fabsf(x) < INFINITY ? fabsf(x) : 0.0f; };  // NaN, inf: 0
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int j = tid + 128 * k;
    if (((j >> 3) & 63) < real_rows) {
      const uint4 v = reinterpret_cast<const uint4*>(q)[j];
      const uint32_t x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        mx = fmaxf(mx, fmaxf(fin(__uint_as_float(x[e] << 16)), fin(__uint_as_float(x[e] & 0xFFFF0000u))));
    }
  }
  // Non-negative floats order as their bits.
  const uint32_t wmax = __reduce_max_sync(0xffffffffu, __float_as_uint(mx));
  if ((tid & 31) == 0) qmax[tid >> 5] = __uint_as_float(wmax);
  warpgroup_barrier(0);
  const F16RowScale rs = f16_row_scale(fmaxf(fmaxf(qmax[0], qmax[1]), fmaxf(qmax[2], qmax[3])));
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int j = tid + 128 * k;
    uint4 h = make_uint4(0u, 0u, 0u, 0u);
    if (((j >> 3) & 63) < real_rows) {  // read again: not held across the barrier
      const uint4 v = reinterpret_cast<const uint4*>(q)[j];
      h = make_uint4(bf16x2_scaled_to_f16x2(v.x, rs.up), bf16x2_scaled_to_f16x2(v.y, rs.up),
                     bf16x2_scaled_to_f16x2(v.z, rs.up), bf16x2_scaled_to_f16x2(v.w, rs.up));
    }
    reinterpret_cast<uint4*>(q)[j] = h;
  }
  fence_proxy_async_smem();  // the generic writes before the wgmma's reads
  warpgroup_barrier(0);
  return rs.down;
}

// wgmma_fp8=on, converter warp cw (0..3) of ring cw / 2 (0: K, 1: V), keys 64 (cw % 2) .. + 63 of
// each block: per stage in ring order, once the raw block landed (raw_full), its half converted in
// place, V's keys past the block's visible ones zeroed (what mtp_wgmma_load_v's fix gives); the
// writes fenced for the async proxy and published by lane 0 (k_full / v_full: one arrival per
// converter warp, two) as zero_tile_rows_from's are. The loader reuses the stage only after the
// consumers release it (k_empty / v_empty). Returns at the loader's "no work left" word.
MSA_DEVICE void mtp_fp8_converter(uint8_t* smem, MtpWgmmaBars bars, int cw, int lane) {
  using Cfg = MtpWgmmaFp8Config;
  const int ring = cw >> 1, half = cw & 1;
  const int* info = reinterpret_cast<const int*>(smem + Cfg::kRawInfoOffset) + ring * Cfg::kStages;
  uint8_t* tiles = smem + (ring == 0 ? Cfg::kKOffset : Cfg::kVOffset);
  RingPos pos;
  for (;;) {
    mbar_wait(bars.raw_full(ring, pos.st), pos.ph);
    const int n_valid = info[pos.st];
    mbar_arrive(bars.info_empty(ring, pos.st));  // this lane's read of the word
    if (n_valid < 0) return;
    mtp_fp8_convert_tile(tiles + pos.st * Cfg::kKvBytes, ring == 0 ? kBlockSize : n_valid, half, lane);
    fence_proxy_async_smem();  // this lane's tile writes, before wgmma reads them
    __syncwarp();
    if (lane == 0) mbar_arrive(ring == 0 ? bars.k_full(pos.st) : bars.v_full(pos.st));
    pos.advance();
  }
}

// One block's K or V as the loader issues it: the 16-bit kernel's TMA into the K / V ring
// (mtp_wgmma_load_v's fix for a partial V), or wgmma_fp8=on's raw copy (mtp_fp8_load_raw).
template <bool kFp8>
MSA_DEVICE void mtp_wgmma_issue(const MtpWgmmaArgs& ta, uint8_t* smem, MtpWgmmaBars bars, bool is_v,
                                RingPos pos,
                                const KvBlockCoords& kc, int n_valid, int& fixes, int lane) {
  if constexpr (kFp8) {
    if (lane == 0) mtp_fp8_load_raw(ta, smem, bars, is_v ? 1 : 0, pos, kc, n_valid);
  } else if (is_v) {
    mtp_wgmma_load_v(ta, smem, bars, pos, kc, n_valid, fixes, lane);
  } else if (lane == 0) {
    using Cfg = MtpWgmmaConfig;
    mbar_wait(bars.k_empty(pos.st), pos.ph ^ 1);
    tma_load_kv_block(ta.a.p.kv.paged, &ta.k_map, smem_addr(smem + Cfg::kKOffset + pos.st * Cfg::kKvBytes),
                      bars.k_full(pos.st), kc);
  }
}

// wgmma_pipe=ahead, the loader warp (lane 0..31): per planned item Q, then each block's K, with V
// one block behind K (V_u - 1 after K_u: the consumers read V a block after K); lane 0 issues, the
// warp zeroes partial V tiles (mtp_wgmma_load_v). No global load on its path.
// Cfg, kFp8: MtpWgmmaAheadConfig, false; or MtpWgmmaFp8Config, true (raw copies for the converter
// warps, and at the end their "no work left" words).
template <typename Cfg, bool kFp8>
MSA_DEVICE void mtp_wgmma_loader(const MtpWgmmaArgs& ta, uint8_t* smem, MtpWgmmaBars bars, int lane) {
  const SparseAttnParams& p = ta.a.p;
  if (lane == 0) mtp_wgmma_prefetch_maps(ta);
  RingPos kpos, vpos;
  int fixes = 0;  // partial blocks so far (v_fix's phase)
  bool v_pending = false;  // V of the last block whose K was issued
  KvBlockCoords v_kc{};
  int v_valid = 0;
  for (int it = 0;; ++it) {
    const int tb = it & 1;
    const uint32_t ph = (it >> 1) & 1;
    // The last block's V waits for the next item's first K only while that item's plan is ready
    // (short items: the consumers may need this V before the planner can plan the next one).
    const bool ready = __shfl_sync(0xffffffffu, int(mbar_test_wait(bars.plan_full(tb), ph)), 0) != 0;
    if (v_pending && !ready) {
      mtp_wgmma_issue<kFp8>(ta, smem, bars, true, vpos, v_kc, v_valid, fixes, lane);
      vpos.advance();
      v_pending = false;
    }
    mbar_wait(bars.plan_full(tb), ph);
    // Passes at once (the planner waited for this phase): orders Q's TMA after the consumers'
    // staging writes into the buffer in this warp's own view too.
    mbar_wait(bars.q_empty(tb), ph ^ 1);
    const MtpWgmmaPlan& pl = *reinterpret_cast<const MtpWgmmaPlan*>(smem + Cfg::kPlanOffset + tb * Cfg::kPlanBytes);
    const int* coord = reinterpret_cast<const int*>(smem + Cfg::kCoordOffset + tb * Cfg::kCoordBytes);
    if (pl.none != 0) {
      if (v_pending) {
        mtp_wgmma_issue<kFp8>(ta, smem, bars, true, vpos, v_kc, v_valid, fixes, lane);
        vpos.advance();
      }
      if (lane == 0) {
        mbar_arrive(bars.q_full(tb));  // the 33rd arrival: "no work left"
        if constexpr (kFp8) {          // and to the converter warps
          mtp_fp8_load_raw(ta, smem, bars, 0, kpos, {}, -1);
          mtp_fp8_load_raw(ta, smem, bars, 1, vpos, {}, -1);
        }
      }
      return;
    }
    const int kh = pl.kh, U = pl.count;
    if (lane == 0) mtp_wgmma_load_q(ta, smem, bars, tb, kh, pl.r0);
#pragma unroll 1
    for (int u = 0; u < U; ++u, kpos.advance()) {
      const int c = coord[u];
      const KvBlockCoords kc{p.kv.paged ? 0 : kh, p.kv.paged ? kh : c, p.kv.paged ? c : 0};
      const int n_valid = mtp_block_valid(pl.counts[u]);
      mtp_wgmma_issue<kFp8>(ta, smem, bars, false, kpos, kc, n_valid, fixes, lane);
      if (v_pending) {
        mtp_wgmma_issue<kFp8>(ta, smem, bars, true, vpos, v_kc, v_valid, fixes, lane);
        vpos.advance();
      }
      v_pending = true;
      v_kc = kc;
      v_valid = n_valid;
    }
    mbar_arrive(bars.plan_empty(tb));  // this lane's reads of the plan and coordinates are done
    __syncwarp();
  }
}

// fp32 partial rows straight from the accumulator fragments (per store, 8 rows x 32 bytes): row
// gid + 8 h of the warp's 16 at element offset row_off of the lane holding it (lane i < 16: row i;
// < 0: not written), times mul[h].
MSA_DEVICE void store_rows_f32_direct(const float (&o)[16][4], const float (&mul)[2], float* gbase,
                                      int64_t row_off, int lane) {
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t ro = __shfl_sync(0xffffffffu, row_off, gid + 8 * h);
    if (ro < 0) continue;
#pragma unroll
    for (int d = 0; d < 16; ++d)
      *reinterpret_cast<float2*>(gbase + ro + 8 * d + 2 * tig) = make_float2(o[d][2 * h] * mul[h], o[d][2 * h + 1] * mul[h]);
  }
}

// The item's outputs of a consumer warp (its 16 rows): final (out, LSEs) or the split's partial,
// as the query-major kernel writes them; stage: the warp's 4 KB of the consumed Q tile.
template <typename Elem>
MSA_DEVICE void mtp_wgmma_epilogue(const QueryMajorArgs& a, const MtpWgmmaPlan& pl, int warp, int lane,
                                   float (&o)[16][4], const float (&m)[2], float (&l)[2], float (&lt)[2],
                                   uint8_t* stage) {
  const SparseAttnParams& p = a.p;
  const int G = a.group, gid = lane >> 2, tig = lane & 3;
  const float temp = p.lse_temperature;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (a.has_temp) {
      lt[h] += __shfl_xor_sync(0xffffffffu, lt[h], 1);
      lt[h] += __shfl_xor_sync(0xffffffffu, lt[h], 2);
    }
  }
  // Global row of tile row i: out's (token, head) row, or the partial's slot; -1 past the tokens.
  auto row_of = [&](int i) -> int64_t {
    const int t = i / G, hh = i - t * G;
    if (t >= pl.n_tok) return -1;
    const int64_t rq = int64_t(pl.r0) + t;
    return a.write_final ? rq * p.num_heads + pl.kh * G + hh
                         : ((int64_t(pl.kh) * p.total_q + rq) * a.splits + pl.split) * G + hh;
  };
  const int64_t lane_row = lane < 16 ? row_of(16 * warp + lane) : -1;
  const int64_t row_off = lane_row >= 0 ? lane_row * 128 : -1;
  float mul[2];
  const float num = a.write_final ? p.v_global_scale : 1.0f;
#pragma unroll
  for (int h = 0; h < 2; ++h) mul[h] = l[h] > 0.0f ? num / l[h] : 0.0f;
  if (a.write_final) {
    store_rows<kElemStoreKind<Elem>>(o, mul, stage, p.out, row_off, lane);
  } else {
    switch (a.part_kind) {
      case StoreKind::kF32: store_rows_f32_direct(o, mul, static_cast<float*>(a.part_o), row_off, lane); break;
      case StoreKind::kBF16: store_rows<StoreKind::kBF16, true>(o, mul, stage, a.part_o, row_off, lane); break;
      case StoreKind::kF16: store_rows<StoreKind::kF16, true>(o, mul, stage, a.part_o, row_off, lane); break;
      default: store_rows<StoreKind::kFP8>(o, mul, stage, a.part_o, row_off, lane); break;
    }
  }
  if (tig == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t idx = row_of(16 * warp + gid + 8 * h);
      if (idx < 0) continue;
      if (a.write_final) {
        if (p.lse != nullptr) p.lse[idx] = row_lse2(m[h], l[h]) * kLn2;
        if (p.lse_temperature_out != nullptr) p.lse_temperature_out[idx] = row_lse2_t(m[h], lt[h], temp) * kLn2;
      } else {
        a.part_lse[idx] = row_lse2(m[h], l[h]);
        if (a.part_lse_t != nullptr) a.part_lse_t[idx] = row_lse2_t(m[h], lt[h], temp);
      }
    }
  }
}
#endif

// kAhead: wgmma_pipe=ahead (a planner and a loader warp instead of the one producer warp; the
// consumers' code is the same). kFp8 (with kAhead): wgmma_fp8=on, fp8 K/V copied raw and converted
// by the producer warpgroup's other two warps (MtpWgmmaFp8Config; the consumers' code is the
// same on 2-stage rings).
template <typename Elem, bool kAhead, bool kFp8 = false>
__global__ void __launch_bounds__(kFp8 ? MtpWgmmaFp8Config::kThreads : MtpWgmmaConfig::kThreads, 1)
    mtp_wgmma_sm90_kernel(const __grid_constant__ MtpWgmmaArgs ta) {
#if MSA_HAS_WGMMA
  static_assert(kAhead || !kFp8, "fp8 K/V run the ahead pipe's planner and loader");
  using Cfg = std::conditional_t<kFp8, MtpWgmmaFp8Config, MtpWgmmaConfig>;
  using CElem = std::conditional_t<kFp8, __half, Elem>;  // the MMAs' inputs: fp8 K/V compute in fp16
  constexpr bool kQToF16 = kFp8 && !std::is_same_v<Elem, __half>;
  extern __shared__ __align__(1024) uint8_t smem[];
  const QueryMajorArgs& a = ta.a;
  const int tid = threadIdx.x;
  check_smem_base(smem);
  const MtpWgmmaBars bars{smem_addr(smem + Cfg::kBarOffset)};
  if (tid == 0) {
    for (int i = 0; i < Cfg::kItemBufs; ++i) {
      // Every producer lane arrives after its own plan writes (lane 0 with the expect_tx of Q's
      // bytes): union_tma_sm90.cuh says why one arrive per writer. kAhead: the planner's 32 lanes
      // and the loader's expect_tx; the loader waits for the planner's lanes on plan_full.
      mbar_init(bars.q_full(i), kAhead ? 33 : 32);
      mbar_init(bars.q_empty(i), Cfg::kConsumerThreads);
      if constexpr (kAhead) {
        mbar_init(bars.plan_full(i), 32);
        mbar_init(bars.plan_empty(i), 32);
      }
    }
    for (int i = 0; i < Cfg::kStages; ++i) {
      mbar_init(bars.k_full(i), kFp8 ? 2 : 1);  // kFp8: the ring's two converter warps
      mbar_init(bars.k_empty(i), Cfg::kConsumerThreads);
      mbar_init(bars.v_full(i), kFp8 ? 2 : 1);
      mbar_init(bars.v_empty(i), Cfg::kConsumerThreads);
    }
    mbar_init(bars.v_fix(), 1);
    if constexpr (kFp8) {
      for (int ring = 0; ring < 2; ++ring) {
        for (int i = 0; i < MtpWgmmaFp8Config::kStages; ++i) {
          mbar_init(bars.raw_full(ring, i), 1);
          mbar_init(bars.info_empty(ring, i), 64);
        }
      }
    }
    fence_mbarrier_init();
  }
  __syncthreads();  // the only CTA-wide barrier: producer and consumers part here
  if (tid >= Cfg::kConsumerThreads) {
    const int pw = (tid - Cfg::kConsumerThreads) >> 5;
    if constexpr (kFp8) {
      setmaxnreg_dec<MtpWgmmaFp8Config::kOtherRegs>();  // both warpgroups, every warp
      if (pw == 0) mtp_wgmma_loader<Cfg, true>(ta, smem, bars, tid & 31);
      else if (pw == 1) mtp_wgmma_planner<Cfg>(ta, smem, bars, tid & 31);
      else if (pw >= 4) mtp_fp8_converter(smem, bars, pw - 4, tid & 31);  // warps 2, 3 leave
    } else if constexpr (kAhead) {
      if (pw == 0) mtp_wgmma_loader<MtpWgmmaAheadConfig, false>(ta, smem, bars, tid & 31);
      else if (pw == 1) mtp_wgmma_planner<MtpWgmmaAheadConfig>(ta, smem, bars, tid & 31);
    } else {
      if (pw == 0) mtp_wgmma_producer(ta, smem, bars, tid & 31);
    }
    return;
  }
  if constexpr (kFp8) setmaxnreg_inc<MtpWgmmaFp8Config::kConsumerRegs>();

  const int lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const uint32_t sK_addr = smem_addr(smem + Cfg::kKOffset), sV_addr = smem_addr(smem + Cfg::kVOffset);
  const float sc = a.scale_log2, temp = a.p.lse_temperature;
  // Byte of a block's counts holding the visible keys of each fragment row's token (-1: a padding
  // row past the request's tokens).
  int tok_shift[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = (16 * warp + gid + 8 * h) / a.group;
    tok_shift[h] = t < a.mtp_tokens ? 8 * t : -1;
  }

  RingPos pos;
  for (int it = 0;; ++it) {
    const int tb = it & 1;
    mbar_wait_loop(bars.q_full(tb), (it >> 1) & 1);
    const MtpWgmmaPlan& pl = *reinterpret_cast<const MtpWgmmaPlan*>(smem + Cfg::kPlanOffset + tb * Cfg::kPlanBytes);
    if (pl.none != 0) break;
    const int U = pl.count;
    uint8_t* my_q = smem + Cfg::kQOffset + tb * Cfg::kQBytes;
    const uint32_t my_q_addr = smem_addr(my_q);
    float sc_item = sc;  // the softmax scale of this item's logits
    if constexpr (kQToF16) {
      sc_item = sc * mtp_fp8_q_to_f16(my_q, reinterpret_cast<float*>(smem + MtpWgmmaFp8Config::kQmaxOffset),
                                      pl.n_tok * a.group, tid);
    }

    float o[16][4], m_row[2], l_row[2], lt_row[2];
    union_tile_init(o, m_row, l_row, lt_row);
    // The pending P V: P of the last computed block (packed) and its V slot.
    uint32_t pa[8][4];
    bool pending = false;
    RingPos p_pos;
#pragma unroll 1
    for (int u = 0; u < U; ++u, pos.advance()) {
      const uint32_t counts = pl.counts[u];
      mbar_wait_loop(bars.k_full(pos.st), pos.ph);
      float s[16][4];
      wgmma_qk_issue<CElem>(s, my_q_addr, sK_addr + pos.st * Cfg::kKvBytes);
      if (pending) {
        mbar_wait_loop(bars.v_full(p_pos.st), p_pos.ph);
        wgmma_pv_issue<CElem>(o, pa, sV_addr + p_pos.st * Cfg::kKvBytes, true);
        wgmma_wait<1>();  // S_u done, P V of the previous block may still run
      } else {
        wgmma_wait<0>();
      }
      wgmma_fence_operand(s);
      mbar_arrive(bars.k_empty(pos.st));

      float alpha[2];
      int lim[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) lim[h] = tok_shift[h] >= 0 ? int((counts >> tok_shift[h]) & 0xFFu) : 0;
      union_softmax_rows_lim(s, lim, a.has_temp, sc_item, temp, tig, m_row, l_row, lt_row, alpha);
      // P V done (unconditional: on every path the compiler sees no accumulator read while an
      // MMA may run).
      wgmma_wait<0>();
      wgmma_fence_operand(o);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) wgmma_fence_operand(pa[kk]);
      if (pending) mbar_arrive(bars.v_empty(p_pos.st));
      union_rescale(o, alpha);
      pack_p<CElem>(pa, s);
      pending = true;
      p_pos = pos;
    }
    if (pending) {
      mbar_wait_loop(bars.v_full(p_pos.st), p_pos.ph);
      wgmma_pv_issue<CElem>(o, pa, sV_addr + p_pos.st * Cfg::kKvBytes, true);
      wgmma_wait<0>();
      wgmma_fence_operand(o);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) wgmma_fence_operand(pa[kk]);
      mbar_arrive(bars.v_empty(p_pos.st));
    }

    // Epilogue: the warp's rows through its quarter of the (consumed) Q tile.
    mtp_wgmma_epilogue<Elem>(a, pl, warp, lane, o, m_row, l_row, lt_row, my_q + warp * (16 * 256));
    fence_proxy_async_smem();  // the staging writes before the next TMA into this buffer
    mbar_arrive(bars.q_empty(tb));  // Q buffer and plan tb are free for item it + 2
  }
#else
  __trap();  // launched only on sm_90 devices, where the sm_90a image is chosen
#endif
}

// CTAs per SM of the kernel (1), 0 where this device cannot run it (wgmma_pipe=ahead's 0.5 KB more
// shared memory leaves it at the same count: both static_asserts).
template <typename Elem>
int mtp_wgmma_sm90_ctas_per_sm() {
  return flashmsa::cuda::prepare_sm90a_launch(mtp_wgmma_sm90_kernel<Elem, false>, MtpWgmmaConfig::kThreads,
                                              size_t(MtpWgmmaConfig::kSmemBytes));
}

// The same for the kernel of fp8 K/V (wgmma_fp8=on: its own shared-memory size).
template <typename Elem>
int mtp_wgmma_fp8_sm90_ctas_per_sm() {
  return flashmsa::cuda::prepare_sm90a_launch(mtp_wgmma_sm90_kernel<Elem, true, true>, MtpWgmmaFp8Config::kThreads,
                                              size_t(MtpWgmmaFp8Config::kSmemBytes));
}

// Encodes the maps of q, k and v (NotSupported where the driver rejects them; the planner's
// mtp_wgmma_unsupported keeps the calls it sends here within TMA's coordinates) and launches
// `grid` persistent CTAs; ahead: wgmma_pipe=ahead's kernel.
template <typename Elem>
void launch_mtp_wgmma_sm90(const QueryMajorArgs& args, int grid, bool ahead, cudaStream_t stream) {
  const SparseAttnParams& p = args.p;
  MSA_CHECK(args.mtp_tokens >= 1 && args.mtp_tokens * args.group <= 64 && !args.q_fp8 && grid >= 1,
            "msa_sparse_decode_attention: kernel=wgmma planned for a call it does not run (planner bug)");
  MtpWgmmaArgs ta{};
  ta.a = args;
  const CUtensorMapDataType ty = flashmsa::cuda::tma_dtype_16<Elem>();
  const bool ok = flashmsa::cuda::encode_q_map_sw128(ta.q_map, ty, p, uint32_t(args.group), uint32_t(args.mtp_tokens)) &&
                  flashmsa::cuda::encode_kv_maps_sw128(ta.k_map, ta.v_map, ty, p);
  MSA_CHECK_SUPPORTED(ok, "kernel=wgmma: the driver rejected the TMA descriptors of q / k / v");
  auto* kernel = ahead ? mtp_wgmma_sm90_kernel<Elem, true> : mtp_wgmma_sm90_kernel<Elem, false>;
  const int smem = ahead ? MtpWgmmaAheadConfig::kSmemBytes : MtpWgmmaConfig::kSmemBytes;
  flashmsa::cuda::prepare_launch(kernel, MtpWgmmaConfig::kThreads, size_t(smem));
  kernel<<<grid, MtpWgmmaConfig::kThreads, smem, stream>>>(ta);
  MSA_CUDA_CHECK(cudaGetLastError());
}

// wgmma_fp8=on: fp8 e4m3 K/V (bf16 / fp16 q) on the kernel of kFp8 (raw uint8 maps of K and V: one
// 128-byte x 128-key box per block, 128-byte swizzle). Same checks and launch as above.
template <typename Elem>
void launch_mtp_wgmma_fp8_sm90(const QueryMajorArgs& args, int grid, cudaStream_t stream) {
  const SparseAttnParams& p = args.p;
  MSA_CHECK(args.mtp_tokens >= 1 && args.mtp_tokens * args.group <= 64 && !args.q_fp8 && grid >= 1 &&
                p.k.dtype == DType::kFP8E4M3 && p.v.dtype == DType::kFP8E4M3,
            "msa_sparse_decode_attention: wgmma_fp8=on planned for a call it does not run (planner bug)");
  MtpWgmmaArgs ta{};
  ta.a = args;
  const bool ok =
      flashmsa::cuda::encode_q_map_sw128(ta.q_map, flashmsa::cuda::tma_dtype_16<Elem>(), p, uint32_t(args.group),
                                         uint32_t(args.mtp_tokens)) &&
      flashmsa::cuda::encode_kv_maps_raw8(ta.k_map, ta.v_map, p);
  MSA_CHECK_SUPPORTED(ok, "kernel=wgmma, wgmma_fp8=on: the driver rejected the TMA descriptors of q / k / v");
  auto* kernel = mtp_wgmma_sm90_kernel<Elem, true, true>;
  const int smem = MtpWgmmaFp8Config::kSmemBytes;
  flashmsa::cuda::prepare_launch(kernel, MtpWgmmaFp8Config::kThreads, size_t(smem));
  kernel<<<grid, MtpWgmmaFp8Config::kThreads, smem, stream>>>(ta);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn
