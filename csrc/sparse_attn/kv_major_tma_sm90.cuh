// KV-major sparse attention on Hopper (sm_90a) in FlashAttention-3's structure: the plan option
// kv_major_kernel=tma (bf16 / fp16 K and V of the compute dtype, G a multiple of 8 that divides 64
// or is a multiple of 64). Same lists, items, partial layout, combine and results as
// kv_major_sm90.cuh (read its header first; docs/design/sparse_attention.md#kv-major-tma has the
// cost model); what differs:
//   producer      one warp (the other three of its warpgroup leave at once; 40 registers). Per item
//                 it takes the item from the work counter, copies the item's list entries (<= 256
//                 tokens) into shared memory and loads the block's K and V by TMA (a 128-key box per
//                 64-dim half, flat or paged, as union_tma_sm90.cuh) into one of two K/V buffers:
//                 the next item's block loads while the consumers still work on the current one.
//                 Then it gathers each 64-row query tile into a 4-stage ring: one 3-D box of q
//                 (64 dims x min(G, 64) heads x 1 token) per token and 64-dim half, straight into
//                 the 128-byte-swizzled [2][64][64] tile the wgmma descriptors read. Completion on
//                 mbarriers (expect_tx); a block past the sequence's end has V rows n_valid..127
//                 zeroed before it is published (as in union_tma_sm90.cuh).
//   2 consumers   (232 registers) take alternate 64-row tiles of the CTA's tile stream (which runs
//                 on across items): S of a warpgroup's next tile is issued before the softmax of its
//                 current one, so the tensor core works during the softmax; P V, then O / l
//                 staged into the warpgroup's own swizzled staging tile and written by TMA stores
//                 (one box per token and half), so no consumer waits on global stores. A Q slot is
//                 released as soon as the S that read it completes, a K/V buffer when both
//                 consumers are past the item.
// A row's partial depends only on its query row and the block (row-independent MMAs, the softmax of
// kv_major_sm90.cuh reduced in a fixed order), never on which CTA, warpgroup or tile computed it (D11).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "common/cuda_utils.h"
#include "common/mbarrier.cuh"
#include "common/tensor_map.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "flashmsa/error.h"
#include "sparse_attn/kv_major_sm90.cuh"

namespace flashmsa::sparse_attn {

struct KvMajorTmaArgs {
  CUtensorMap q_map;  // q as (128 dims, Hq, total_q), box (64, min(G, 64), 1)
  CUtensorMap k_map;  // common/tensor_map.h encode_kv_block_map, box0 64
  CUtensorMap v_map;
  CUtensorMap o_map;  // part_o as (128 dims, Hkv * chunk_rows * topk * G rows), box (64, min(G, 64))
  KvMajorArgs a;
};

struct KvMajorTmaConfig {
  static constexpr int kConsumerThreads = 256;  // two warpgroups
  static constexpr int kThreads = kConsumerThreads + 128;
  // 65536 / 384 = 168 at launch; setmaxnreg then 40 + 2 x 232 = 3 x 168 (union_tma_sm90.cuh's split).
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kQStages = 4;  // Q ring: ~3 tiles in flight ahead of the two consumers
  static constexpr int kTileBytes = 64 * 256;         // a 64-row Q tile or partial staging tile
  static constexpr int kKvBytes = kBlockSize * 256;   // K or V of one block
  static constexpr int kMaxTokens = kKvmTmaMaxTokensPerItem;
  // K0, K1, V0, V1, the Q ring, two staging tiles (one per consumer): 1024-byte aligned.
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = 2 * kKvBytes;
  static constexpr int kQOffset = 4 * kKvBytes;
  static constexpr int kStageOffset = kQOffset + kQStages * kTileBytes;
  static constexpr int kListOffset = kStageOffset + 2 * kTileBytes;  // [2][kMaxTokens] entries
  static constexpr int kItemOffset = kListOffset + 2 * kMaxTokens * 4;  // [2] item records
  static constexpr int kItemBytes = 64;
  // mbarriers: q_full[4], q_empty[4], item_full[2] (record + list + K bytes), v_full[2],
  // kv_empty[2], v_fix.
  static constexpr int kBarOffset = kItemOffset + 2 * kItemBytes;
  static constexpr int kNumBars = 2 * kQStages + 3 * 2 + 1;
  static constexpr int kSmemBytes = kBarOffset + kNumBars * 8;
};
static_assert(KvMajorTmaConfig::kProducerRegs + 2 * KvMajorTmaConfig::kConsumerRegs <=
                  3 * (65536 / KvMajorTmaConfig::kThreads / 8 * 8),
              "register split");
static_assert(KvMajorTmaConfig::kSmemBytes <= 227 * 1024, "shared memory plan exceeds the sm_90 opt-in limit");
static_assert(sizeof(KvmItemState) <= KvMajorTmaConfig::kItemBytes, "item record fits its slot");
// Every 128-byte-swizzled box lands 1024-byte aligned (the swizzle is taken from address bits
// 4..9): K / V buffers and their 64-dim halves, Q stages and staging tiles and their halves; a
// token's box at row e x min(G, 64) of a tile is too, G being a multiple of 8 (the planner's
// kv_major_tma_unsupported).
static_assert(KvMajorTmaConfig::kKOffset % 1024 == 0 && KvMajorTmaConfig::kVOffset % 1024 == 0 &&
                  KvMajorTmaConfig::kKvBytes % 1024 == 0 && (kBlockSize * 128) % 1024 == 0 &&
                  KvMajorTmaConfig::kQOffset % 1024 == 0 && KvMajorTmaConfig::kStageOffset % 1024 == 0 &&
                  KvMajorTmaConfig::kTileBytes % 1024 == 0 && (64 * 128) % 1024 == 0,
              "swizzled tiles start on 1024-byte boundaries");
// Tile n of the CTA's stream goes to warpgroup n & 1 and Q stage n % kQStages: with an even stage
// count every stage belongs to one warpgroup, which waits its q_full phases in order (never more
// than one phase from the barrier's). An odd count would hand consecutive phases of a stage to
// different warpgroups: the parity aliasing that faulted the first proxy decode TMA ring.
static_assert(KvMajorTmaConfig::kQStages % 2 == 0, "each Q stage is consumed by one warpgroup");
static_assert(KvMajorTmaConfig::kItemOffset % 8 == 0 && KvMajorTmaConfig::kItemBytes % 8 == 0 &&
                  KvMajorTmaConfig::kBarOffset % 8 == 0,
              "item records (int64 fields) and mbarriers 8-byte aligned");

#if MSA_HAS_WGMMA
// Barrier addresses (bars = the first one's shared address).
struct KvmTmaBars {
  uint32_t base;
  MSA_DEVICE uint32_t q_full(int st) const { return base + 8 * st; }
  MSA_DEVICE uint32_t q_empty(int st) const { return base + 8 * (KvMajorTmaConfig::kQStages + st); }
  MSA_DEVICE uint32_t item_full(int s) const { return base + 8 * (2 * KvMajorTmaConfig::kQStages + s); }
  MSA_DEVICE uint32_t v_full(int s) const { return base + 8 * (2 * KvMajorTmaConfig::kQStages + 2 + s); }
  MSA_DEVICE uint32_t kv_empty(int s) const { return base + 8 * (2 * KvMajorTmaConfig::kQStages + 4 + s); }
  MSA_DEVICE uint32_t v_fix() const { return base + 8 * (2 * KvMajorTmaConfig::kQStages + 6); }
};

// Row i of an item (a (token, head) pair: token i / G, head i % G) and what its list entry says.
struct KvmTmaRow {
  int rel;   // query row - row_begin
  int slot;  // q2k position
  int g;     // head within the kv head's group
};
MSA_DEVICE KvmTmaRow kvm_tma_row(const uint32_t* list, int i, int G) {
  const int e = i / G;
  const uint32_t v = list[e];
  return {int(v >> 6), int(v & 63u), i - e * G};
}
// Partial row (slot index) of an item row: kv_major.cuh's layout.
MSA_DEVICE int64_t kvm_tma_slot(const KvMajorArgs& args, int kh, const KvmTmaRow& r) {
  return ((int64_t(kh) * args.chunk_rows + r.rel) * args.p.topk + r.slot) * args.group + r.g;
}

// The producer warp (lane 0..31): see the top of the file.
MSA_DEVICE void kvm_tma_producer(const KvMajorTmaArgs& ta, uint8_t* smem, KvmTmaBars bars, int lane) {
  using Cfg = KvMajorTmaConfig;
  const KvMajorArgs& args = ta.a;
  const SparseAttnParams& p = args.p;
  if (lane == 0) {
    tma_prefetch_map(&ta.q_map);
    tma_prefetch_map(&ta.k_map);
    tma_prefetch_map(&ta.v_map);
  }
  const int G = args.group, box_rows = G < 64 ? G : 64;
  int n = 0;      // Q tiles issued (ring position)
  int fixes = 0;  // partial blocks so far (v_fix's phase)
#pragma unroll 1
  for (int it = 0;; ++it) {
    const int s = it & 1;
    mbar_wait(bars.kv_empty(s), ((it >> 1) & 1) ^ 1);  // both consumers are past item it - 2
    KvmItemState* rec = reinterpret_cast<KvmItemState*>(smem + Cfg::kItemOffset + s * Cfg::kItemBytes);
    uint32_t* list = reinterpret_cast<uint32_t*>(smem + Cfg::kListOffset) + s * Cfg::kMaxTokens;
    if (lane == 0) *rec = fetch_kvm_item(args);
    __syncwarp();
    const int kh = rec->kh;
    if (kh < 0) {
      mbar_arrive(bars.item_full(s));  // publishes "no work left" (every lane: item_full counts 32)
      return;
    }
    const int b = rec->b, j0 = rec->j0, rows = rec->rows, seqlen_k = rec->seqlen_k;
    const int tokens = rows / G;
    for (int e = lane; e < tokens; e += 32) list[e] = args.list[rec->start + e];
    const bool partial = seqlen_k - j0 < kBlockSize;
    const uint32_t sK = smem_addr(smem + Cfg::kKOffset + s * Cfg::kKvBytes);
    const uint32_t sV = smem_addr(smem + Cfg::kVOffset + s * Cfg::kKvBytes);
    if (lane == 0) {
      // The list builder emits only blocks with a valid page, so the page is >= 0 here.
      const int64_t row0 = p.kv.paged ? 0 : kv_row_begin(p.kv, b);
      const int c1 = p.kv.paged ? 0 : kh, c2 = p.kv.paged ? kh : int(row0 + j0);
      const int c3 = p.kv.paged ? int(kv_page(p.kv, b, j0 / kBlockSize)) : 0;
      auto load = [&](const CUtensorMap* map, uint32_t dst, uint32_t bar) {
        mbar_expect_tx(bar, Cfg::kKvBytes);  // lane 0's arrival on bar, with the bytes
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (p.kv.paged) tma_load_4d(dst + half * (kBlockSize * 128), map, bar, 64 * half, c1, c2, c3);
          else tma_load_3d(dst + half * (kBlockSize * 128), map, bar, 64 * half, c1, c2);
        }
      };
      load(&ta.k_map, sK, bars.item_full(s));  // after lane 0's own list writes
      load(&ta.v_map, sV, partial ? bars.v_fix() : bars.v_full(s));
    } else {
      mbar_arrive(bars.item_full(s));  // this lane's list writes
    }
    if (partial) {
      mbar_wait(bars.v_fix(), fixes & 1);
      ++fixes;
      const int n_valid = max(seqlen_k - j0, 0);
      uint8_t* v = smem + Cfg::kVOffset + s * Cfg::kKvBytes;
      for (int c = n_valid * 8 + lane; c < kBlockSize * 8; c += 32) {  // 8 chunks of 16 bytes per row and half
        const int row = c >> 3, ch = c & 7;
        *reinterpret_cast<uint4*>(v + row * 128 + ch * 16) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(v + kBlockSize * 128 + row * 128 + ch * 16) = make_uint4(0u, 0u, 0u, 0u);
      }
      fence_proxy_async_smem();  // generic writes, read by wgmma / overwritten by TMA next
      __syncwarp();
      if (lane == 0) mbar_arrive(bars.v_full(s));
    }
    // The item's query tiles into the ring (lane 0; the list entries it reads are its own or
    // ordered by the __syncwarp below the v_fix zeroing / the one here).
    __syncwarp();
    if (lane == 0) {
      const int n_tiles = (rows + 63) / 64;
#pragma unroll 1
      for (int t = 0; t < n_tiles; ++t, ++n) {
        const int st = n % Cfg::kQStages;
        mbar_wait(bars.q_empty(st), ((n / Cfg::kQStages) & 1) ^ 1);
        const int boxes = min(64, rows - 64 * t) / box_rows;  // rows is a multiple of G
        mbar_expect_tx(bars.q_full(st), uint32_t(boxes * box_rows * 256));
        const uint32_t sQ = smem_addr(smem + Cfg::kQOffset + st * Cfg::kTileBytes);
#pragma unroll 1
        for (int k = 0; k < boxes; ++k) {
          const KvmTmaRow r = kvm_tma_row(list, 64 * t + k * box_rows, G);
#pragma unroll
          for (int half = 0; half < 2; ++half)
            tma_load_3d(sQ + uint32_t(half * 64 * 128 + k * box_rows * 128), &ta.q_map, bars.q_full(st), 64 * half,
                        kh * G + r.g, args.row_begin + r.rel);
        }
      }
    }
    __syncwarp();
  }
}

// The staging tile of a consumer warpgroup: O / l of its 64 rows in the compute dtype, the
// [2][64][64] 128-byte-swizzled layout of the Q tiles (the TMA store boxes' layout).
template <typename Elem>
MSA_DEVICE void kvm_tma_stage(const float (&o)[16][4], const float (&mul)[2], uint8_t* stage, int warp, int gid,
                              int tig) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + gid + 8 * h;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<uint32_t*>(stage + Sw128Tile<64>::at(row, j) + 4 * tig) =
          pack2_partial<Elem>(o[j][2 * h] * mul[h], o[j][2 * h + 1] * mul[h]);
  }
}
#endif

template <typename Elem>
__global__ void __launch_bounds__(KvMajorTmaConfig::kThreads, 1)
    kv_major_tma_sm90_kernel(const __grid_constant__ KvMajorTmaArgs ta) {
#if MSA_HAS_WGMMA
  using Cfg = KvMajorTmaConfig;
  extern __shared__ __align__(1024) uint8_t smem[];
  const KvMajorArgs& args = ta.a;
  const SparseAttnParams& p = args.p;
  const int tid = threadIdx.x;
  check_smem_base(smem);
  const KvmTmaBars bars{smem_addr(smem + Cfg::kBarOffset)};
  if (tid == 0) {
    for (int i = 0; i < Cfg::kQStages; ++i) {
      mbar_init(bars.q_full(i), 1);
      mbar_init(bars.q_empty(i), 128);  // the warpgroup that computed the tile
    }
    for (int i = 0; i < 2; ++i) {
      // Every producer lane arrives after its own list writes (lane 0 with K's bytes): each write
      // is released by its own thread's arrive (union_tma_sm90.cuh, racecheck).
      mbar_init(bars.item_full(i), 32);
      mbar_init(bars.v_full(i), 1);
      mbar_init(bars.kv_empty(i), Cfg::kConsumerThreads);
    }
    mbar_init(bars.v_fix(), 1);
    fence_mbarrier_init();
  }
  __syncthreads();  // the only CTA-wide barrier: producer and consumers part here
  if (tid >= Cfg::kConsumerThreads) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (tid < Cfg::kConsumerThreads + 32) kvm_tma_producer(ta, smem, bars, tid - Cfg::kConsumerThreads);
    return;
  }
  setmaxnreg_inc<Cfg::kConsumerRegs>();

  const int wg = tid >> 7, wtid = tid & 127;
  const int lane = tid & 31, warp = wtid >> 5, gid = lane >> 2, tig = lane & 3;
  const int G = args.group, box_rows = G < 64 ? G : 64;
  const float temp = p.lse_temperature;
  uint8_t* stage = smem + Cfg::kStageOffset + wg * Cfg::kTileBytes;
  const uint32_t stage_addr = smem_addr(stage);
  auto record = [&](int it) -> const KvmItemState& {
    return *reinterpret_cast<const KvmItemState*>(smem + Cfg::kItemOffset + (it & 1) * Cfg::kItemBytes);
  };
  auto item_list = [&](int it) {
    return reinterpret_cast<const uint32_t*>(smem + Cfg::kListOffset) + (it & 1) * Cfg::kMaxTokens;
  };

  // This warpgroup's walk through the CTA's tile stream: tile t of item it is the stream's tile
  // base + t, and the warpgroup takes the tiles of its parity. held: the item of the tile in
  // progress (its K/V buffer, record and list are released after its epilogue), -1 for none.
  int it = 0, base = 0, ntiles = 0, t = 0, held = -1;
  bool rec_ready = false;
  constexpr int kFound = 0, kEnd = 1, kDefer = 2;
  // Moves to the next tile of ours at or after (it, t). Items passed without a tile of ours are
  // released at once. While a tile is held it looks at most one item past the held one: the
  // producer refills the held item's buffer slot with item held + 2, so waiting for that record
  // before releasing the held item would deadlock (kDefer: call again after the release).
  auto walk = [&]() -> int {
#pragma unroll 1
    while (true) {
      if (rec_ready && t < ntiles) return kFound;
      if (rec_ready) {
        if (it != held) mbar_arrive(bars.kv_empty(it & 1));
        base += ntiles;
        ++it;
        rec_ready = false;
      }
      if (held >= 0 && it > held + 1) return kDefer;
      mbar_wait_loop(bars.item_full(it & 1), (it >> 1) & 1);  // record, list and K landed
      rec_ready = true;
      if (record(it).kh < 0) return kEnd;
      ntiles = (record(it).rows + 63) / 64;
      t = (wg + base) & 1;
    }
  };

  // Issues S of the current walk position's tile into s (Q slot and K buffer waited for).
  auto issue_s = [&](float (&s)[16][4]) {
    const int n = base + t, st = n % Cfg::kQStages;
    mbar_wait_loop(bars.q_full(st), (n / Cfg::kQStages) & 1);
    wgmma_qk_issue_new<Elem>(s, smem_addr(smem + Cfg::kQOffset + st * Cfg::kTileBytes),
                         smem_addr(smem + Cfg::kKOffset + (it & 1) * Cfg::kKvBytes));
  };

  // One tile: s holds its S (complete); s_next receives S of the next tile, issued before this
  // tile's softmax. Returns whether a next tile exists (its S then complete in s_next).
  auto step = [&](float (&s)[16][4], float (&s_next)[16][4]) -> bool {
    const int cur_it = it, cur_t = t;
    const KvmItemState& rec = record(cur_it);
    const uint32_t* list = item_list(cur_it);
    const int kh = rec.kh, rows = rec.rows;
    // This thread's rows 16 warp + gid + 8 h of the tile: limits and partial rows.
    int lim[2];
    int64_t slot_row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = 64 * cur_t + 16 * warp + gid + 8 * h;
      lim[h] = 0;
      slot_row[h] = -1;
      if (i < rows) {
        const KvmTmaRow r = kvm_tma_row(list, i, G);
        const int qr = args.row_begin + r.rel;
        lim[h] = max(0, min(kBlockSize, col_limit(p.causal, rec.q_off, qr - rec.q_begin, rec.seqlen_k) - rec.j0));
        slot_row[h] = kvm_tma_slot(args, kh, r);
      }
    }

    held = cur_it;
    t += 2;
    int next = walk();
    // Warp-uniform to the compiler too: no wgmma may sit in a branch it thinks divergent (C7518).
    const bool has_next = __shfl_sync(0xffffffffu, next == kFound, 0);
    const int next_st = (base + t) % Cfg::kQStages;
    if (has_next) issue_s(s_next);

    float m_row[2], l_row[2], lt_row[2];
    kvm90_softmax(s, lim, args.has_temp, args.scale_log2, temp, tig, m_row, l_row, lt_row);

    uint32_t pa[8][4];
    pack_p<Elem>(pa, s);
    // S of the next tile done (unconditional: with nothing in flight it is free). P V is a wgmma
    // group of its own: issued while S of the next tile were still in flight, the fresh O's
    // registers could be softmax temporaries defined during that group, and ptxas would serialize
    // every wgmma (C7515); an O kept across tiles instead would cost 64 registers (spills).
    wgmma_wait<0>();
    wgmma_fence_operand(s_next);
    if (has_next) mbar_arrive(bars.q_empty(next_st));  // S read its Q tile: the slot is free
    mbar_wait_loop(bars.v_full(cur_it & 1), (cur_it >> 1) & 1);
    float o[16][4];
    wgmma_pv_issue<Elem>(o, pa, smem_addr(smem + Cfg::kVOffset + (cur_it & 1) * Cfg::kKvBytes), false);
    wgmma_wait<0>();
    wgmma_fence_operand(o);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_fence_operand(pa[kk]);

    // Epilogue: O / l through the staging tile, written by TMA stores (one box per token and half).
    float mul[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) mul[h] = l_row[h] > 0.0f ? 1.0f / l_row[h] : 0.0f;
    if (wtid == 0) bulk_wait_read<0>();  // the previous tile's stores have read the staging tile
    warpgroup_barrier(wg);
    kvm_tma_stage<Elem>(o, mul, stage, warp, gid, tig);
    fence_proxy_async_smem();  // the staging writes -> the TMA store (async proxy)
    warpgroup_barrier(wg);
    if (wtid == 0) {
      const int boxes = min(64, rows - 64 * cur_t) / box_rows;
#pragma unroll 1
      for (int k = 0; k < boxes; ++k) {
        const int64_t row = kvm_tma_slot(args, kh, kvm_tma_row(list, 64 * cur_t + k * box_rows, G));
#pragma unroll
        for (int half = 0; half < 2; ++half)
          tma_store_2d(&ta.o_map, stage_addr + uint32_t(half * 64 * 128 + k * box_rows * 128), 64 * half, int(row));
      }
      bulk_commit();
    }
    if (tig == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (slot_row[h] >= 0) {
          args.part_lse[slot_row[h]] = row_lse2(m_row[h], l_row[h]);
          if (args.part_lse_t != nullptr) args.part_lse_t[slot_row[h]] = row_lse2_t(m_row[h], lt_row[h], temp);
        }
      }
    }
    // The held item: its K/V buffer, record and list are free once no tile of ours needs them.
    if (next != kFound || it != cur_it) mbar_arrive(bars.kv_empty(cur_it & 1));
    held = -1;
    if (__shfl_sync(0xffffffffu, next == kDefer, 0)) {
      next = walk();
      if (__shfl_sync(0xffffffffu, next == kFound, 0)) {
        issue_s(s_next);
        wgmma_wait<0>();
        wgmma_fence_operand(s_next);
        mbar_arrive(bars.q_empty((base + t) % Cfg::kQStages));
        return true;
      }
      return false;
    }
    return has_next;
  };

  if (__shfl_sync(0xffffffffu, walk() == kFound, 0)) {
    float sa[16][4], sb[16][4];
    issue_s(sa);
    wgmma_wait<0>();
    wgmma_fence_operand(sa);
    mbar_arrive(bars.q_empty((base + t) % Cfg::kQStages));
#pragma unroll 1
    while (step(sa, sb)) {
      // S of the next tile becomes the current one. Two steps per iteration with the arrays
      // trading places would save these 64 moves, but ptxas then serializes every wgmma (C7515)
      // and spills (ptxas 13.0).
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sa[j][e] = sb[j][e];
    }
  }
  if (wtid == 0) bulk_wait<0>();  // this warpgroup's partial stores are complete
#else
  __trap();  // launched only on sm_90 devices, where the sm_90a image is chosen
#endif
}

// CTAs per SM of the TMA KV-major kernel, 0 where this device cannot run it.
template <typename Elem>
int kv_major_tma_sm90_ctas_per_sm() {
  return flashmsa::cuda::prepare_sm90a_launch(kv_major_tma_sm90_kernel<Elem>, KvMajorTmaConfig::kThreads,
                                              size_t(KvMajorTmaConfig::kSmemBytes));
}

// Encodes the maps of q, k, v and the partial output (NotSupported where the driver rejects them;
// the planner's kv_major_tma_unsupported keeps the calls it sends here within TMA's coordinates,
// strides and group sizes) and launches.
template <typename Elem>
void launch_kv_major_tma_sm90(const KvMajorArgs& args, int grid, cudaStream_t stream) {
  const SparseAttnParams& p = args.p;
  KvMajorTmaArgs ta{};
  ta.a = args;
  const CUtensorMapDataType ty = flashmsa::cuda::tma_dtype_16<Elem>();
  const uint32_t box_rows = uint32_t(args.group < 64 ? args.group : 64);
  const bool ok = flashmsa::cuda::encode_q_map_sw128(ta.q_map, ty, p, box_rows, 1) &&
                  flashmsa::cuda::encode_kv_maps_sw128(ta.k_map, ta.v_map, ty, p) &&
                  encode_partial_map<Elem>(ta.o_map, args, box_rows);
  MSA_CHECK_SUPPORTED(ok, "kv_major_kernel=tma: the driver rejected the TMA descriptors of q / k / v / partials");
  auto* kernel = kv_major_tma_sm90_kernel<Elem>;
  constexpr int smem = KvMajorTmaConfig::kSmemBytes;
  flashmsa::cuda::prepare_launch(kernel, KvMajorTmaConfig::kThreads, size_t(smem));
  kernel<<<grid, KvMajorTmaConfig::kThreads, smem, stream>>>(ta);
  MSA_CUDA_CHECK(cudaGetLastError());
}

}  // namespace flashmsa::sparse_attn
