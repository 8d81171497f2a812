// msa_proxy_score prefill on Hopper (sm_90a): the GEMM-like kernel. out[h, t, r] = max over the
// visible keys j of block t of dot(q[r, h], k[j, h / G]), fp32 accumulate
// (docs/semantics.md#proxy-score-math), computed by wgmma on operands brought in by TMA.
// docs/design/proxy_score.md ("The sm_90a prefill kernel") has the reasoning behind each number.
//
// CTA = 3 warpgroups, one per SM, persistent:
//   warpgroup 0   producer: one thread issues the TMA loads (Q tiles, K blocks) into
//                 128-byte-swizzled shared memory, completing on "full" mbarriers. fp8 / NVFP4 K
//                 (KFormat): the loads land raw in a staging ring, and the warpgroup's warps 1-3
//                 (96 threads) convert each block exactly into the 16-bit swizzled K stage (NVFP4:
//                 also each Q tile into its Q slot), then fence.proxy.async and arrive on the
//                 stage's "full" mbarrier; the consumers' code is the same for every format
//   warpgroups 1-2  consumers: each owns two of the tile's four 64-row sub-tiles and multiplies
//                 them against every key block the tile sees (wgmma m64n128k16; K from shared
//                 memory, Q from shared memory or registers: QSource), then reduces each row over
//                 the block's 128 keys (masked on the causal diagonal and at the end of the keys)
//                 and stores the block's maxima
// Tile = 256 MMA rows = 4 sub-tiles; sub-tile = one query head x 64 consecutive tokens, so one K
// block feeds every head of the KV group (hc heads per CTA, hc in {1, 2, 4}; with hc < 4 the
// sub-tiles are 4 / hc consecutive 64-token chunks of each head). K is flat (rank-3 tensor map) or
// paged (rank-4: a 128-token page is one box).
// Overlap: the consumer warpgroups take turns issuing their MMAs of a block; each reduces its
// first sub-tile while its second multiplies, and its second while the other warpgroup's MMAs run.
// Work items (sequence, q-tile, head group, key-block chunk) run longest causal tiles first, dealt
// to the persistent CTAs in snake order so that every CTA gets a similar share of the triangle.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/cuda_utils.h"
#include "common/e2m1_word.cuh"
#include "common/mbarrier.cuh"
#include "common/tensor_map.h"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "flashmsa/params.h"
#include "flashmsa/semantics.h"
#include "proxy_score/launch.h"
#include "proxy_score/nvfp4_scale_area.cuh"
#include "proxy_score/proxy_score_config.h"

namespace flashmsa::cuda::proxy::sm90 {

inline constexpr int kThreads = 384;                            // producer warpgroup + 2 consumer warpgroups
inline constexpr int kSubRows = 64;                             // rows of a sub-tile (one wgmma M)
inline constexpr int kSubTiles = 4;                             // per CTA tile, 2 per consumer warpgroup
inline constexpr int kSubTileBytes = kSubRows * kHeadDim * 2;   // 16 KB: [2 halves][64][64]
inline constexpr int kQTileBytes = kSubTiles * kSubTileBytes;   // 64 KB
inline constexpr int kKBlockBytes = kBlockSize * kHeadDim * 2;  // 32 KB: [2 halves][128][64]
inline constexpr int kConsumerThreads = 256;
// fp8 / NVFP4 K: warps 1-3 of the producer warpgroup convert (warp 0's thread 0 issues the TMA).
inline constexpr int kConverterThreads = 96;

// The operands as they arrive in global memory:
//   kNative  bf16 / fp16 q and K of q's dtype: TMA straight into the MMA layout
//   kFp8     bf16 / fp16 q (TMA), e4m3 K staged raw and converted exactly to q's dtype
//   kNvfp4   NVFP4 q and K (msa_proxy_score_fp4): both staged raw and dequantized exactly into
//            bf16 (e2m1 x e4m3 has at most 6 significant bits); the block maxima are multiplied by
//            logit_scale (> 0: monotone rounding makes that equal to scaling every logit)
//   kFp8F16  bf16 q (TMA) and e4m3 K on fp16 MMAs (plan option kernel=sm90_f16; Q in registers
//            only): K converted to fp16 (one cvt a pair instead of kFp8's cvt, two half -> float
//            and a bf16 pack); each Q row scaled into fp16 by 2^(14 - E) as its A fragments are
//            loaded (E: the exponent of the row's largest |q|, common/ptx.cuh f16_row_scale, as
//            the decode kernel does) and its block maxima multiplied by 2^(E - 14): a power of
//            two, exact and monotone, so the same products and maxima as kFp8 (q elements below
//            2^-32 of their row's maximum would round in fp16: docs/design/proxy_score.md)
//   kNvfp4F16  NVFP4 q and K on fp16 MMAs (plan option kernel=sm90_f16 with msa_proxy_score_fp4;
//            auto's since the H200 run at 23476c9): each code pair placed as fp16 code x 2^-14 and multiplied by
//            its block scale x 2^7 in one HMUL2 (common/ptx.cuh: value x 2^-7, exact in fp16), q
//            and K alike, so every logit is the exact product sum times 2^-14; the block maxima
//            are multiplied by logit_scale x 2^14 (a positive power of two times kNvfp4's factor)
//   kFp8Q    fp8 e4m3 q and K on fp16 MMAs (plan option kernel=sm90_f16 / sm90_f16_only, not
//            auto's until measured; Q in registers only): Q's raw bytes land by TMA in the Q slot
//            (128-byte rows, 128-byte swizzle) and each consumer builds its A fragments from them
//            with one cvt.rn.f16x2.e4m3x2 a pair (exact: e4m3 is a subset of fp16), K as kFp8F16;
//            so every logit is the exact product sum, as the mma.sync kernel's bf16 MMAs give
enum class KFormat { kNative, kFp8, kNvfp4, kFp8F16, kNvfp4F16, kFp8Q };
// The formats whose K arrives as e4m3 bytes, and those of NVFP4 q and K.
__host__ __device__ constexpr bool is_fp8_k(KFormat f) {
  return f == KFormat::kFp8 || f == KFormat::kFp8F16 || f == KFormat::kFp8Q;
}
__host__ __device__ constexpr bool is_fp4(KFormat f) { return f == KFormat::kNvfp4 || f == KFormat::kNvfp4F16; }

// Shared memory plan of each variant (QSource: proxy_score/launch.h): Q slots, the K ring, the raw
// K staging ring, the raw Q staging slot (NVFP4), then the mbarriers. Converted formats trade one
// 16-bit K stage for the staging: raw + converted stages together still keep 4-6 blocks in flight.
template <QSource kQ, KFormat kFmt = KFormat::kNative>
struct Layout {
  static constexpr bool kConvert = kFmt != KFormat::kNative;
  static constexpr bool kRegsQ = kQ == QSource::kRegs;
  static constexpr int kQSlots = kRegsQ ? 1 : 2;
  static constexpr int kKStages = !kConvert ? (kRegsQ ? 4 : 3) : (kRegsQ ? 3 : 2);
  // One raw block: 128 keys x 128 fp8 bytes (16 KB) or x 64 bytes of e2m1 pairs (8 KB). NVFP4 K
  // with Q in registers (kStagedScales): the block's 1 KB of scales follow its codes in the stage
  // (nvfp4_scale_area.cuh; a bulk copy beside the TMA for a paged block, gathered by the producer
  // warp's lanes for a flat one), so the converting threads read them from shared memory; with Q
  // in shared memory (no room for the 2 KB) they read them from global memory.
  static constexpr bool kStagedScales = is_fp4(kFmt) && kRegsQ;
  static constexpr int kRawBytes = is_fp8_k(kFmt) ? kBlockSize * kHeadDim
                                   : is_fp4(kFmt) ? kBlockSize * kHeadDim / 2
                                                             : 0;
  static constexpr int kRawStageBytes = kRawBytes + (kStagedScales ? kNvfp4ScaleAreaBytes : 0);
  static constexpr int kRawStages = !kConvert ? 0 : (kRegsQ ? (is_fp8_k(kFmt) ? 3 : 4) : 2);
  static constexpr int kQRawBytes = is_fp4(kFmt) ? kSubTiles * kSubRows * kHeadDim / 2 : 0;
  static constexpr int kQOffset = 0;
  static constexpr int kKOffset = kQOffset + kQSlots * kQTileBytes;
  static constexpr int kRawOffset = kKOffset + kKStages * kKBlockBytes;
  static constexpr int kQRawOffset = kRawOffset + kRawStages * kRawStageBytes;
  static constexpr int kBarOffset = kQRawOffset + kQRawBytes;
  static constexpr int kNumBars = 2 * kQSlots + 2 * kKStages + 2 * kRawStages + (kQRawBytes > 0 ? 2 : 0);
  // +1024: the dynamic shared memory base is aligned up to the 1024 bytes the swizzle atoms need.
  static constexpr int kSmemBytes = kBarOffset + kNumBars * 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory plan exceeds the sm_90 opt-in limit");
  static_assert(kRawOffset % 1024 == 0 && kRawStageBytes % 1024 == 0 && kQRawOffset % 1024 == 0 &&
                    kBarOffset % 1024 == 0,
                "swizzled stages start on 1024-byte boundaries");
};
inline constexpr int kProducerRegs = 40;
inline constexpr int kConsumerRegs = 232;
static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register budget");

// Kernel parameters: the op's params, the two TMA descriptors and the host's launch plan.
struct Params {
  CUtensorMap q_map;  // q as (128 dims, Hq, total_q), box (64, 1, 64); NVFP4: (64 bytes, Hq,
                      // total_q), box (64, 1, 64), 64-byte swizzle
  CUtensorMap k_map;  // flat k as (128 dims, Hkv, total_k), box (64, 1, 128); paged k as
                      // (128 dims, 128 tokens, Hkv, num_pages), box (64, 128, 1, 1): a page is a box.
                      // fp8 / NVFP4: bytes, a row (128 / 64 bytes) is one box wide, swizzled 128 / 64
  ProxyScoreParams p;
  bool paged;
  int group_size;     // G
  int heads_per_cta;  // hc in {1, 2, 4}, dividing G
  int chunks;         // 4 / hc: 64-token chunks per head in a tile
  int num_groups;     // Hkv * G / hc
  int n_qt;           // q-tiles per sequence on the item list (more are strided over)
  int split_blocks;   // key blocks per work item: a tile's blocks come in chunks of this many
  int n_split;        // ceil(P / split_blocks): chunks per tile
  int64_t n_items;    // n_qt * batch * num_groups * n_split
};

// One q-tile of one head group, as every role of the CTA computes it from the item.
struct Tile {
  int64_t row_begin;  // global q row of token tok0
  int64_t q_off;      // global position of local query 0 of the sequence
  int b;
  int kh;     // KV head
  int head0;  // first query head of the group slice
  int tok0;   // first token (local index in the sequence)
  int ntok;   // tokens in the tile (<= 64 * chunks)
  int seqlen_k;
  int k_row0;   // flat: row of key 0 of the sequence
  int t_begin;  // key blocks computed by this item: [t_begin, t_end)
  int t_end;
  int col_end;    // columns of this item: [t_begin, col_end); [t_end, col_end) are -inf
  int lim_first;  // keys [0, lim_first) are visible to every token of the tile
};

MSA_DEVICE Tile make_tile(const Params& kp, int b, int g, int split, int64_t rbegin, int tok0, int ntok) {
  const ProxyScoreParams& p = kp.p;
  Tile t;
  t.b = b;
  t.tok0 = tok0;
  t.ntok = ntok;
  t.row_begin = rbegin + tok0;
  t.seqlen_k = kv_seqlen(p.kv, b);
  t.k_row0 = kp.paged ? 0 : int(kv_row_begin(p.kv, b));
  const RowRange rows = q_rows(p.qi, p.total_q, b);
  t.q_off = q_offset_of(p.q_offset, b, rows.len, t.seqlen_k);
  const int subgroups = kp.group_size / kp.heads_per_cta;
  t.kh = g / subgroups;
  t.head0 = t.kh * kp.group_size + (g - t.kh * subgroups) * kp.heads_per_cta;
  t.lim_first = col_limit(p.causal, t.q_off, tok0, t.seqlen_k);
  const int lim_last = col_limit(p.causal, t.q_off, tok0 + ntok - 1, t.seqlen_k);
  const int n_blocks = int(min(int64_t(p.max_k_tiles), ceil_div(lim_last, kBlockSize)));
  t.t_begin = split * kp.split_blocks;
  t.col_end = min(p.max_k_tiles, t.t_begin + kp.split_blocks);
  t.t_end = max(t.t_begin, min(n_blocks, t.col_end));
  return t;
}

// Calls f(tile) for every tile of this CTA, in the same order in every role.
template <typename F>
MSA_DEVICE void for_each_tile(const Params& kp, F&& f) {
  const ProxyScoreParams& p = kp.p;
  const int64_t grid = gridDim.x;
  const int tile_tokens = kSubRows * kp.chunks;
  for (int64_t round = 0;; ++round) {
    // Snake order: even rounds deal items 0..grid-1 to CTAs 0..grid-1, odd rounds backwards.
    const int64_t w = round * grid + ((round & 1) ? grid - 1 - blockIdx.x : blockIdx.x);
    if (w >= kp.n_items) break;
    const int split = int(w % kp.n_split);
    const int64_t wt = w / kp.n_split;
    const int g = int(wt % kp.num_groups);
    const int64_t rest = wt / kp.num_groups;
    const int b = int(rest % p.batch);
    const int qt = kp.n_qt - 1 - int(rest / p.batch);  // longest causal tiles first
    const RowRange rows = q_rows(p.qi, p.total_q, b);
    // Strided over q-tiles: correct even when max_seqlen_q under-estimates a sequence.
    for (int64_t tile = qt; tile * tile_tokens < rows.len; tile += kp.n_qt) {
      const int tok0 = int(tile * tile_tokens);
      const int ntok = int(min(int64_t(tile_tokens), rows.len - tile * tile_tokens));
      f(make_tile(kp, b, g, split, rows.begin, tok0, ntok));
    }
  }
}

MSA_DEVICE float neg_inf_f() { return __int_as_float(0xFF800000); }

// Every output store is a streaming store (st.global.cs): the output (Hq x P x S floats, 2 GB at
// 128K tokens) is written once and read by the next op, and should not push the K blocks, which
// every CTA re-reads, out of L2.

#if MSA_HAS_WGMMA
// Issues S = Q K^T for a 64-row sub-tile and a 128-key block (8 wgmma m64n128k16, both operands in
// shared memory) as one commit group; the caller waits for it and then fences `s` (nothing may
// touch the accumulators in between).
template <typename Elem>
MSA_DEVICE void issue_qk(float (&s)[16][4], uint32_t q_addr, uint32_t k_addr) {
  wgmma_fence_operand(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t koff = uint32_t(kk & 3) * 32u;  // 16 dims = 32 bytes into the 64-dim half
    const uint64_t da = wgmma_desc_sw128(q_addr + uint32_t(kk >> 2) * (kSubRows * 128) + koff, 0, 1024);
    const uint64_t db = wgmma_desc_sw128(k_addr + uint32_t(kk >> 2) * (kBlockSize * 128) + koff, 0, 1024);
    wgmma_m64n128k16_ss<Elem, 0>(s, da, db, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// The same with the sub-tile's A fragments in registers (qa[kk]: k-step kk of this warp's 16 rows).
template <typename Elem>
MSA_DEVICE void issue_qk_rs(float (&s)[16][4], const uint32_t (&qa)[8][4], uint32_t k_addr) {
  wgmma_fence_operand(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t koff = uint32_t(kk & 3) * 32u;
    const uint64_t db = wgmma_desc_sw128(k_addr + uint32_t(kk >> 2) * (kBlockSize * 128) + koff, 0, 1024);
    wgmma_m64n128k16_rs<Elem, 0>(s, qa[kk], db, kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// A fragments of this warp's 16 rows of a Q sub-tile ([2 halves][64 rows][64 dims], 128-byte
// swizzle: 16-byte chunk c of row r at chunk c ^ (r % 8) of the row's 128 bytes). Matrices of
// ldmatrix.x4 for k-step ks: (rows +0..7, dims +0..7), (+8..15, +0..7), (+0..7, +8..15),
// (+8..15, +8..15) = the mma.sync / wgmma A fragment registers a0..a3.
MSA_DEVICE void load_q_fragments(uint32_t (&qa)[8][4], uint32_t sub_addr, int warp, int lane) {
  const int r = 16 * warp + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
    const int c = 2 * ks + (lane >> 4);  // 16-byte chunk of the 256-byte row
    const uint32_t addr = sub_addr + uint32_t(c >> 3) * (kSubRows * 128) + uint32_t(r) * 128u +
                          (uint32_t((c & 7) ^ (r & 7)) << 4);
    ldmatrix_x4(qa[ks], addr);
  }
}

// kFp8F16: this warp's A fragments of one sub-tile (bf16; rows gid in qa[ks][0] and qa[ks][2], gid
// + 8 in qa[ks][1] and qa[ks][3], the row's 128 dims over the 4 lanes of a quad) scaled into fp16
// row by row (f16_row_scale of the row's largest |q|); returns the rows' down-scale factors
// 2^(E - 14) as biased fp32 exponent fields (bits 0-7: row gid, 8-15: row gid + 8), one register
// for the tile instead of two floats.
MSA_DEVICE uint32_t q_fragments_to_f16(uint32_t (&qa)[8][4]) {
  float mx[2] = {0.0f, 0.0f};
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
#pragma unroll
    for (int r = 0; r < 4; ++r) mx[r & 1] = fmaxf(mx[r & 1], bf16x2_abs_max(qa[ks][r]));
  uint32_t fields = 0u;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const F16RowScale sc = f16_row_scale(quad_max(mx[h]));
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      qa[ks][h] = bf16x2_scaled_to_f16x2(qa[ks][h], sc.up);
      qa[ks][h + 2] = bf16x2_scaled_to_f16x2(qa[ks][h + 2], sc.up);
    }
    fields |= (__float_as_uint(sc.down) >> 23) << (8 * h);
  }
  return fields;
}

// kFp8Q: this warp's A fragments of one sub-tile (the load_q_fragments layout, in fp16) from its
// raw e4m3 rows (64 rows x 128 bytes at raw_sub, 128-byte swizzle: 16-byte chunk c of row r at
// chunk c ^ (r & 7)): the pair of dims (16 ks + 2 tig + 8 c, + 1) of rows gid and gid + 8, one
// 16-bit shared load and one exact cvt each. Once per tile, so the 8-way bank conflicts of rows
// 128 bytes apart (the 8 rows of a quad column) cost nothing that matters.
MSA_DEVICE void load_q_fragments_fp8(uint32_t (&qa)[8][4], const uint8_t* raw_sub, int warp, int lane) {
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * warp + gid + 8 * h;
    const uint8_t* row = raw_sub + r * 128;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint16_t two = *reinterpret_cast<const uint16_t*>(row + ((ks ^ (r & 7)) << 4) + 2 * tig + 8 * c);
        qa[ks][h + 2 * c] = e4m3x2_to_f16x2_bits(two);
      }
  }
}

// ---- the converting threads (fp8 / NVFP4 K) ----
// Work of one raw 128-row block is cut into tasks (row r, 16-byte raw chunk c); the 8 lanes of a
// shared-memory phase take 8 consecutive rows of one chunk, so that with the swizzled raw stage
// (TMA swizzle 128 B for 128-byte fp8 rows: chunk c of row r at c ^ (r % 8); 64 B for 64-byte NVFP4
// rows: at c ^ ((r / 2) % 4)) the loads and the stores into the 128-byte-swizzled 16-bit stage
// ([2 halves][rows][64 dims]: 16-byte chunk o of row r at half o / 8, position (o % 8) ^ (r % 8))
// are free of bank conflicts.

// fp8 block [128 keys][128 B] -> 16-bit K stage: 1024 tasks of 16 values (two output chunks). Task
// idx is row r = 8 (idx / 64) + idx % 8, raw chunk c = (idx / 8) % 8 (the phase order above); its
// addresses in closed form: a thread's tasks are idx = tid + 96 k, and 96 is a multiple of 8 and
// 3 x 32, so e = idx % 8 (the row's swizzle phase) is the thread's for every task, the chunk c
// alternates between c0 and c0 ^ 4 (12 k = 4 k mod 8), and a task's raw offset is (idx / 64) x 1024
// plus one of two per-thread constants, its two converted chunks (idx / 64) x 1024 plus one of two
// constants and that plus or minus 16 (the chunks 2 m and 2 m + 1, m = c % 4, differ in bit 0
// only). ~27 instructions a task instead of ~43 rebuilding the row and swizzled chunks from the
// index (H200 at 73ba220: fp8 32K prefill 836.8 vs 887.2 us). Two tasks per iteration (one of each
// parity), one after the other: both loads first spilled at the converters' 40 registers.
template <typename Elem>
MSA_DEVICE void convert_k_fp8(const uint8_t* raw, uint8_t* conv, int tid) {
  // The per-thread constants are recomputed per block (~10 instructions) rather than hoisted and
  // kept across the tile loop, where the converters' 40 registers would spill them.
  asm volatile("" : "+r"(tid));
  const int e = tid & 7, c0 = (tid >> 3) & 7;
  const int lo = ((2 * (c0 & 3)) ^ e) << 4;
  const int delta = (e & 1) ? -16 : 16;
  const int raw_c[2] = {e * 128 + ((c0 ^ e) << 4), e * 128 + (((c0 ^ 4) ^ e) << 4)};
  const int conv_c[2] = {(c0 >> 2) * (kBlockSize * 128) + e * 128 + lo,
                         ((c0 >> 2) ^ 1) * (kBlockSize * 128) + e * 128 + lo};
  auto task = [&](int idx, int par) {
    const int q = (idx >> 6) * 1024;
    uint4 a, b;
    e4m3x16_to_mma<Elem>(*reinterpret_cast<const uint4*>(raw + q + raw_c[par]), a, b);
    *reinterpret_cast<uint4*>(conv + q + conv_c[par]) = a;
    *reinterpret_cast<uint4*>(conv + q + conv_c[par] + delta) = b;
  };
#pragma unroll 1
  for (int idx = tid; idx < kBlockSize * 8; idx += 2 * kConverterThreads) {
    task(idx, 0);
    if (idx + kConverterThreads < kBlockSize * 8) task(idx + kConverterThreads, 1);
  }
}

// NVFP4: 128 rows of 64 bytes = 512 tasks of 32 values (16 raw bytes, two block scales), at most
// kFp4Tasks = 6 per converting thread. The scales are read from global memory first
// (load_fp4_scales, before the raw block's wait, so that their latency overlaps it): task i's two
// scale bytes (columns 2c, 2c + 1 of its row, adjacent in the 128x4 layout) in 16 bits of three
// registers, which convert_fp4 shifts down task by task (an indexed array would live in local
// memory: the producer warpgroup has 40 registers).
inline constexpr int kFp4Tasks = (kBlockSize * 4 + kConverterThreads - 1) / kConverterThreads;  // 6
static_assert(kFp4Tasks <= 6, "three registers of 16-bit scale pairs");
struct Fp4Scales {
  uint32_t w0, w1, w2;  // tasks (0, 1), (2, 3), (4, 5): low half first
};
MSA_DEVICE int fp4_task_row(int idx) { return ((idx >> 5) << 3) | (idx & 7); }
MSA_DEVICE int fp4_task_chunk(int idx) { return (idx >> 3) & 3; }

// scale_row(r): the logical scale row of raw row r, or < 0 for a row without keys (scales 0).
template <typename RowFn>
MSA_DEVICE Fp4Scales load_fp4_scales(const uint8_t* scales, RowFn scale_row, int tid) {
  uint32_t v[6];
#pragma unroll
  for (int i = 0; i < 6; ++i) {
    const int idx = tid + i * kConverterThreads;
    const int64_t row = idx < kBlockSize * 4 ? scale_row(fp4_task_row(idx)) : -1;
    v[i] = row >= 0 ? uint32_t(__ldg(reinterpret_cast<const unsigned short*>(
                          scales + nvfp4_scale_offset(row, 2 * fp4_task_chunk(idx)))))
                    : 0u;
  }
  return {v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16)};
}

// The scale pair of each task, in task order: from the registers load_fp4_scales filled ...
struct Fp4RegPairs {
  Fp4Scales sc;
  MSA_DEVICE uint32_t operator()(int /*r*/, int /*c*/) {
    const uint32_t pair = sc.w0 & 0xFFFFu;
    sc.w0 = (sc.w0 >> 16) | (sc.w1 << 16);
    sc.w1 = (sc.w1 >> 16) | (sc.w2 << 16);
    sc.w2 >>= 16;
    return pair;
  }
};
// ... or from the staged block's scale area (rows from n_keys on: scale 0, as load_fp4_scales
// gives them; their bytes in the area are stale).
struct Fp4AreaPairs {
  const uint8_t* area;
  int n_keys;
  MSA_DEVICE uint32_t operator()(int r, int c) const {
    return r < n_keys ? uint32_t(*reinterpret_cast<const uint16_t*>(area + nvfp4_area_pair_offset(r, c))) : 0u;
  }
};

// NVFP4 rows [128][64 B] -> the 16-bit swizzled layout: a K stage (kQTile false: [2][128][64]) or
// two consecutive Q sub-tiles (kQTile true: rows 64 s + r of sub-tile s, each [2][64][64]).
// Values are e2m1x2_to's, the mma.sync kernel's conversion; next_pair(r, c): the task's scale pair.
template <typename Elem, bool kQTile, typename PairFn>
MSA_DEVICE void convert_fp4(const uint8_t* raw, uint8_t* dst, PairFn next_pair, int tid) {
#pragma unroll 1
  for (int idx = tid; idx < kBlockSize * 4; idx += kConverterThreads) {
    const int r = fp4_task_row(idx), c = fp4_task_chunk(idx), x = r & 7;
    const uint32_t pair = next_pair(r, c);
    const uint4 in = *reinterpret_cast<const uint4*>(raw + r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
    uint8_t* row = kQTile ? dst + (r >> 6) * kSubTileBytes + (c >> 1) * (kSubRows * 128) + (r & 63) * 128
                          : dst + (c >> 1) * (kBlockSize * 128) + r * 128;
    const uint32_t w[4] = {in.x, in.y, in.z, in.w};
    if constexpr (std::is_same_v<Elem, __half>) {
      // kNvfp4F16: value x 2^-7 (common/ptx.cuh): the pair's codes as fp16 code x 2^-14 times the
      // block scale x 2^7, one HMUL2 a pair with the scale's half selected in the operand.
      const uint32_t s2 = nvfp4_scale_pair_x128(pair);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint4 out;
        out.x = hmul2_half_bits(e2m1x2_code_bits(w[q] & 0xFFu), s2, q >> 1);
        out.y = hmul2_half_bits(e2m1x2_code_bits((w[q] >> 8) & 0xFFu), s2, q >> 1);
        out.z = hmul2_half_bits(e2m1x2_code_bits((w[q] >> 16) & 0xFFu), s2, q >> 1);
        out.w = hmul2_half_bits(e2m1x2_code_bits(w[q] >> 24), s2, q >> 1);
        *reinterpret_cast<uint4*>(row + ((((4 * c + q) & 7) ^ x) << 4)) = out;
      }
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // output chunk 4c + q: values 32c + 8q .., the 4 bytes of w[q]
        const float scale = e4m3_to_float(uint8_t(pair >> (8 * (q >> 1)))) * 16384.0f;
        uint4 out;
        out.x = e2m1x2_to<Elem>(w[q] & 0xFFu, scale);
        out.y = e2m1x2_to<Elem>((w[q] >> 8) & 0xFFu, scale);
        out.z = e2m1x2_to<Elem>((w[q] >> 16) & 0xFFu, scale);
        out.w = e2m1x2_to<Elem>(w[q] >> 24, scale);
        *reinterpret_cast<uint4*>(row + ((((4 * c + q) & 7) ^ x) << 4)) = out;
      }
    }
  }
}

// Issue-order barriers of the two consumer warpgroups (ids 1 and 2; 0 is __syncthreads): warpgroup
// c waits on kOrderBarrier + c before issuing its MMAs and then arrives on the other's.
inline constexpr int kOrderBarrier = 1;
MSA_DEVICE void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kConsumerThreads) : "memory");
}
MSA_DEVICE void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kConsumerThreads) : "memory");
}

MSA_DEVICE float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;\n" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// The block maxima of one sub-tile's S = Q K^T (block t) -> out. Thread rows 16 warp + gid + 8 h;
// `out_row` points at the sub-tile's first token in column 0 of its head, `lim_row[h]` is the
// number of keys row h sees (col_limit). kMasked: keys at or past a row's limit are -inf (the
// blocks that cross some token's causal / length limit); unmasked blocks take every key. NaN
// propagates (max.NaN, canonical NaN) as in the reference.
// kScaled (NVFP4): the maxima times lscale > 0, which equals the maximum of the scaled logits bit
// for bit (rounding is monotone), as the mma.sync kernel computes it. kRowScale (kFp8F16): row h's
// maximum times its power of two 2^(E - 14) (biased exponent field h of row_exp: bits 8 h .. 8 h + 7),
// exact, back to q's scale.
template <bool kMasked, bool kScaled, bool kRowScale = false>
MSA_DEVICE void store_block_max(const float (&s)[16][4], float* out_row, int64_t total_q,
                                const int (&lim_row)[2], int ntok_sub, int t, bool has_page, int warp,
                                int lane, float lscale, uint32_t row_exp = 0u) {
  const int gid = lane >> 2, tig = lane & 3;
  // Relative to this thread's first key 2 tig of each n8 group: key 8 j + e is visible iff
  // 8 j + e < lim.
  int lim[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) lim[h] = lim_row[h] - t * kBlockSize - 2 * tig;
  // Four independent max chains per row (by j and e parity), so that the FMNMX latency overlaps.
  float mc[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int c = 0; c < 4; ++c) mc[h][c] = neg_inf_f();
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1, c = 2 * (j & 1) + (e & 1);
      if constexpr (kMasked) {
        mc[h][c] = 8 * j + (e & 1) < lim[h] ? max_nan(mc[h][c], s[j][e]) : mc[h][c];
      } else {
        mc[h][c] = max_nan(mc[h][c], s[j][e]);
      }
    }
  float m[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) m[h] = max_nan(max_nan(mc[h][0], mc[h][1]), max_nan(mc[h][2], mc[h][3]));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m[h] = max_nan(m[h], __shfl_xor_sync(0xFFFFFFFFu, m[h], 1));
    m[h] = max_nan(m[h], __shfl_xor_sync(0xFFFFFFFFu, m[h], 2));
    if constexpr (kScaled) m[h] *= lscale;
    if constexpr (kRowScale) m[h] *= __uint_as_float(((row_exp >> (8 * h)) & 0xFFu) << 23);
  }
  if (tig == 0) {
    if (!has_page) m[0] = m[1] = neg_inf_f();  // an invalid page id: the block has no key
    float* o = out_row + int64_t(t) * total_q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * warp + gid + 8 * h;
      if (r < ntok_sub) __stcs(o + r, m[h]);
    }
  }
}

// -inf for rows no sequence covers: [0, cu_seqlens_q[0]) and [cu_seqlens_q[B], total_q), spread
// over every consumer thread of the grid.
MSA_DEVICE void fill_uncovered_rows(const ProxyScoreParams& p, int ctid) {
  const int64_t total_q = p.total_q;
  const UncoveredRows rows = uncovered_q_rows(p.qi, p.batch, total_q);
  if (rows.count == 0) return;
  const int64_t n = int64_t(p.num_heads) * p.max_k_tiles * rows.count;
  const int64_t step = int64_t(gridDim.x) * kConsumerThreads;
  for (int64_t e = int64_t(blockIdx.x) * kConsumerThreads + ctid; e < n; e += step) {
    const int64_t ht = e / rows.count;  // head * P + t
    __stcs(p.out + ht * total_q + rows.row(e % rows.count), neg_inf_f());
  }
}
#endif  // MSA_HAS_WGMMA

template <typename Elem, QSource kQ, KFormat kFmt>
__global__ void __launch_bounds__(kThreads, 1) proxy_score_sm90_kernel(const __grid_constant__ Params kp) {
#if MSA_HAS_WGMMA
  using L = Layout<kQ, kFmt>;
  static_assert(kFmt != KFormat::kFp8F16 || (kQ == QSource::kRegs && std::is_same_v<Elem, __nv_bfloat16>),
                "kFp8F16: bf16 q scaled into fp16 in registers");
  static_assert(kFmt != KFormat::kFp8Q || kQ == QSource::kRegs, "kFp8Q: fp8 q converted in registers");
  using Mma = std::conditional_t<kFmt == KFormat::kFp8F16 || kFmt == KFormat::kNvfp4F16 || kFmt == KFormat::kFp8Q,
                                 __half, Elem>;  // wgmma operands
  constexpr int kQSlots = L::kQSlots, kKStages = L::kKStages, kRawStages = L::kRawStages;
  constexpr bool kQConvert = is_fp4(kFmt);  // Q converted by the producer warpgroup too
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const ProxyScoreParams& p = kp.p;
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  uint8_t* const smem = smem_raw + (base - smem_addr(smem_raw));  // the same, as a pointer
  const uint32_t sQ = base + L::kQOffset, sK = base + L::kKOffset;
  const uint32_t sRaw = base + L::kRawOffset, sQRaw = base + L::kQRawOffset;
  const uint32_t bar = base + L::kBarOffset;
  // Barriers: q_full[kQSlots], q_empty[kQSlots], k_full[kKStages], k_empty[kKStages],
  // raw_full[kRawStages], raw_empty[kRawStages], q_raw_full, q_raw_empty (NVFP4).
  auto q_full = [&](int i) { return bar + 8u * uint32_t(i); };
  auto q_empty = [&](int i) { return bar + 8u * uint32_t(kQSlots + i); };
  auto k_full = [&](int i) { return bar + 8u * uint32_t(2 * kQSlots + i); };
  auto k_empty = [&](int i) { return bar + 8u * uint32_t(2 * kQSlots + kKStages + i); };
  auto raw_full = [&](int i) { return bar + 8u * uint32_t(2 * kQSlots + 2 * kKStages + i); };
  auto raw_empty = [&](int i) { return bar + 8u * uint32_t(2 * kQSlots + 2 * kKStages + kRawStages + i); };
  const uint32_t q_raw_full = bar + 8u * uint32_t(2 * kQSlots + 2 * kKStages + 2 * kRawStages);
  const uint32_t q_raw_empty = q_raw_full + 8u;
  // Warp-uniform for the compiler too (a shuffle result): wgmma in a path it cannot prove uniform
  // is serialized.
  const int wg = __shfl_sync(0xFFFFFFFFu, int(threadIdx.x >> 7), 0);

  if (threadIdx.x == 0) {
    tma_prefetch_map(&kp.q_map);
    tma_prefetch_map(&kp.k_map);
    // A "full" barrier completes on the TMA thread's expect_tx arrival and the bytes, or on the
    // arrivals of the converting threads.
    for (int i = 0; i < kQSlots; ++i) {
      mbar_init(q_full(i), kQConvert ? kConverterThreads : 1);
      mbar_init(q_empty(i), kConsumerThreads);
    }
    for (int i = 0; i < kKStages; ++i) {
      mbar_init(k_full(i), L::kConvert ? kConverterThreads : 1);
      mbar_init(k_empty(i), kConsumerThreads);
    }
    // Flat NVFP4 K with staged scales: each producer lane's cp.async arrival counts too.
    for (int i = 0; i < kRawStages; ++i) {
      mbar_init(raw_full(i), L::kStagedScales && !kp.paged ? 1 + 32 : 1);
      mbar_init(raw_empty(i), kConverterThreads);
    }
    if constexpr (kQConvert) {
      mbar_init(q_raw_full, 1);
      mbar_init(q_raw_empty, kConverterThreads);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<kProducerRegs>();
    if constexpr (L::kConvert) {
      // ---- converting threads (warps 1-3): raw stage -> 16-bit stage, in the TMA thread's order ----
      if (threadIdx.x >= 32) {
        const int tid = int(threadIdx.x) - 32;
        uint32_t nq = 0, nk = 0;
        for_each_tile(kp, [&](const Tile& tile) {
          if (tile.t_end <= tile.t_begin) return;
          if constexpr (kQConvert) {
            const int qs = int(nq % kQSlots);
            uint8_t* q_dst = smem + L::kQOffset + qs * kQTileBytes;
#pragma unroll 1
            for (int half = 0; half < 2; ++half) {  // sub-tiles 2 half, 2 half + 1: 128 rows
              const Fp4Scales sc = load_fp4_scales(
                  p.q_scale,
                  [&](int r) -> int64_t {
                    const int j = 2 * half + (r >> 6);
                    const int hl = j / kp.chunks, tok = (j - hl * kp.chunks) * kSubRows + (r & 63);
                    return tok < tile.ntok ? (tile.row_begin + tok) * p.num_heads + tile.head0 + hl : -1;
                  },
                  tid);
              if (half == 0) {
                mbar_wait_loop(q_raw_full, nq & 1u);
                mbar_wait_loop(q_empty(qs), ((nq / kQSlots) & 1u) ^ 1u);
              }
              convert_fp4<Mma, true>(smem + L::kQRawOffset + half * (2 * kSubRows * 64),
                                      q_dst + half * 2 * kSubTileBytes, Fp4RegPairs{sc}, tid);
            }
            fence_proxy_async_smem();  // the generic-proxy stores, before wgmma reads them
            mbar_arrive(q_raw_empty);
            mbar_arrive(q_full(qs));
          }
          ++nq;
#pragma unroll 1
          for (int t = tile.t_begin; t < tile.t_end; ++t, ++nk) {
            const int rs = int(nk % kRawStages), st = int(nk % kKStages);
            const int64_t page = kp.paged ? kv_page(p.kv, tile.b, t) : 0;
            Fp4Scales sc{};
            const int n_keys = min(kBlockSize, tile.seqlen_k - t * kBlockSize);
            if constexpr (is_fp4(kFmt) && !L::kStagedScales) {
              const int64_t row0 = kp.paged ? nvfp4_scale_row_paged(page, tile.kh, 0, p.num_kv_heads)
                                            : nvfp4_scale_row_flat(int64_t(tile.k_row0) + t * kBlockSize,
                                                                   tile.kh, p.num_kv_heads);
              const int64_t step = kp.paged ? 1 : p.num_kv_heads;
              sc = load_fp4_scales(
                  p.k.scale, [&](int r) -> int64_t { return page >= 0 && r < n_keys ? row0 + r * step : -1; },
                  tid);
            }
            mbar_wait_loop(raw_full(rs), (nk / kRawStages) & 1u);
            mbar_wait_loop(k_empty(st), ((nk / kKStages) & 1u) ^ 1u);
            if (page >= 0) {  // an invalid page: nothing landed, the consumers write -inf
              const uint8_t* raw = smem + L::kRawOffset + rs * L::kRawStageBytes;
              uint8_t* conv = smem + L::kKOffset + st * kKBlockBytes;
              if constexpr (is_fp8_k(kFmt)) {
                convert_k_fp8<Mma>(raw, conv, tid);
              } else if constexpr (L::kStagedScales) {
                convert_fp4<Mma, false>(raw, conv, Fp4AreaPairs{raw + L::kRawBytes, n_keys}, tid);
              } else {
                convert_fp4<Mma, false>(raw, conv, Fp4RegPairs{sc}, tid);
              }
            }
            fence_proxy_async_smem();
            mbar_arrive(raw_empty(rs));
            mbar_arrive(k_full(st));
          }
        });
        return;
      }
    }
    // Thread 0 issues the loads; for flat NVFP4 K with staged scales the other lanes of its warp
    // walk the same blocks and gather each one's scales (nvfp4_scale_area.cuh).
    const bool gather = L::kStagedScales && !kp.paged;
    if (threadIdx.x >= (gather ? 32u : 1u)) return;
    const int lane = int(threadIdx.x);
    uint32_t nq = 0, nk = 0;  // Q tiles / K blocks loaded so far: slot, stage and phase
    // K blocks are re-read by every CTA whose tiles see them: keep them in L2 ahead of the
    // streaming output (evict_last).
    const uint64_t k_policy = l2_policy_evict_last();
    for_each_tile(kp, [&](const Tile& tile) {
      if (tile.t_end <= tile.t_begin) return;
      if (lane != 0) {
        // Q is thread 0's; the K blocks' raw stages below are the warp's.
      } else if constexpr (kQConvert) {
        // Raw NVFP4 Q: 4 sub-tiles of 64 tokens x 64 bytes (4 KB each) into the staging slot.
        mbar_wait_loop(q_raw_empty, (nq & 1u) ^ 1u);
        mbar_expect_tx(q_raw_full, L::kQRawBytes);
#pragma unroll 1
        for (int j = 0; j < kSubTiles; ++j) {
          const int hl = j / kp.chunks, chunk = j - hl * kp.chunks;
          const int row = int(tile.row_begin) + chunk * kSubRows;
          tma_load_3d(sQRaw + uint32_t(j) * (kSubRows * 64), &kp.q_map, q_raw_full, 0, tile.head0 + hl, row);
        }
      } else if constexpr (kFmt == KFormat::kFp8Q) {
        // Raw e4m3 Q: 4 sub-tiles of 64 tokens x 128 bytes (8 KB each) into the Q slot.
        const int qs = int(nq % kQSlots);
        mbar_wait_loop(q_empty(qs), ((nq / kQSlots) & 1u) ^ 1u);
        mbar_expect_tx(q_full(qs), kSubTiles * kSubRows * kHeadDim);
#pragma unroll 1
        for (int j = 0; j < kSubTiles; ++j) {
          const int hl = j / kp.chunks, chunk = j - hl * kp.chunks;
          const int row = int(tile.row_begin) + chunk * kSubRows;
          tma_load_3d(sQ + uint32_t(qs) * kQTileBytes + uint32_t(j) * (kSubRows * kHeadDim), &kp.q_map, q_full(qs),
                      0, tile.head0 + hl, row);
        }
      } else {
        const int qs = int(nq % kQSlots);
        mbar_wait_loop(q_empty(qs), ((nq / kQSlots) & 1u) ^ 1u);
        mbar_expect_tx(q_full(qs), kQTileBytes);
#pragma unroll 1
        for (int j = 0; j < kSubTiles; ++j) {
          const int hl = j / kp.chunks, chunk = j - hl * kp.chunks;
          const uint32_t dst = sQ + uint32_t(qs) * kQTileBytes + uint32_t(j) * kSubTileBytes;
          const int row = int(tile.row_begin) + chunk * kSubRows;
          tma_load_3d(dst, &kp.q_map, q_full(qs), 0, tile.head0 + hl, row);
          tma_load_3d(dst + kSubRows * 128, &kp.q_map, q_full(qs), 64, tile.head0 + hl, row);
        }
      }
      ++nq;
#pragma unroll 1
      for (int t = tile.t_begin; t < tile.t_end; ++t, ++nk) {
        if constexpr (L::kConvert) {
          // One raw box per block (a row of 128 / 64 bytes is one box wide) into the staging ring,
          // staged NVFP4 scales after it: a paged block's scale tile by one bulk copy on the same
          // barrier, a flat block's rows gathered by the warp's lanes.
          const int rs = int(nk % kRawStages);
          mbar_wait_loop(raw_empty(rs), ((nk / kRawStages) & 1u) ^ 1u);
          const uint32_t dst = sRaw + uint32_t(rs) * L::kRawStageBytes;
          if constexpr (L::kStagedScales) {
            if (gather) {
              const int64_t srow0 =
                  nvfp4_scale_row_flat(int64_t(tile.k_row0) + t * kBlockSize, tile.kh, p.num_kv_heads);
              gather_flat_scales(p, dst + L::kRawBytes, srow0, min(kBlockSize, tile.seqlen_k - t * kBlockSize), lane);
              mbar_arrive_cp_async_noinc(raw_full(rs));
            }
          }
          if (lane != 0) continue;
          if (!kp.paged) {
            mbar_expect_tx(raw_full(rs), L::kRawBytes);
            tma_load_3d_hint(dst, &kp.k_map, raw_full(rs), 0, tile.kh, tile.k_row0 + t * kBlockSize, k_policy);
          } else if (const int64_t page = kv_page(kp.p.kv, tile.b, t); page >= 0) {
            mbar_expect_tx(raw_full(rs), L::kRawStageBytes);
            tma_load_4d_hint(dst, &kp.k_map, raw_full(rs), 0, 0, tile.kh, int(page), k_policy);
            if constexpr (L::kStagedScales)
              bulk_load(dst + L::kRawBytes,
                        p.k.scale + nvfp4_scale_offset(nvfp4_scale_row_paged(page, tile.kh, 0, p.num_kv_heads), 0),
                        kNvfp4ScaleAreaBytes, raw_full(rs));
          } else {
            mbar_arrive(raw_full(rs));  // nothing to load; the converting threads skip the block
          }
          continue;
        }
        const int st = int(nk % kKStages);
        mbar_wait_loop(k_empty(st), ((nk / kKStages) & 1u) ^ 1u);
        const uint32_t dst = sK + uint32_t(st) * kKBlockBytes;
        if (!kp.paged) {
          mbar_expect_tx(k_full(st), kKBlockBytes);
          const int row = tile.k_row0 + t * kBlockSize;
          tma_load_3d_hint(dst, &kp.k_map, k_full(st), 0, tile.kh, row, k_policy);
          tma_load_3d_hint(dst + kBlockSize * 128, &kp.k_map, k_full(st), 64, tile.kh, row, k_policy);
        } else if (const int64_t page = kv_page(kp.p.kv, tile.b, t); page >= 0) {
          mbar_expect_tx(k_full(st), kKBlockBytes);
          tma_load_4d_hint(dst, &kp.k_map, k_full(st), 0, 0, tile.kh, int(page), k_policy);
          tma_load_4d_hint(dst + kBlockSize * 128, &kp.k_map, k_full(st), 64, 0, tile.kh, int(page), k_policy);
        } else {
          // A page id outside the cache: nothing to load (the consumers write -inf for the
          // block); the stage still passes through the ring.
          mbar_arrive(k_full(st));
        }
      }
    });
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<kConsumerRegs>();
  const int cwg = wg - 1;              // consumer warpgroup: sub-tiles 2 cwg, 2 cwg + 1
  const int ctid = threadIdx.x - 128;  // 0..255
  const int wtid = threadIdx.x & 127;
  const int warp = wtid >> 5, lane = threadIdx.x & 31;
  const int64_t total_q = p.total_q;
  // The block maxima's factor: logit_scale (NVFP4); kNvfp4F16's logits are the products x 2^-14.
  const float lscale = kFmt == KFormat::kNvfp4F16 ? p.logit_scale * 16384.0f : p.logit_scale;
  uint32_t nq = 0, nk = 0;
  // Warpgroup 0 issues first: warpgroup 1 gives it the first turn; warpgroup 0 takes back the
  // last turn that warpgroup 1 hands over, so every named-barrier phase completes.
  if (cwg == 1) named_barrier_arrive(kOrderBarrier);
  for_each_tile(kp, [&](const Tile& tile) {
    // The two sub-tiles of this warpgroup: head, first token and valid tokens of each.
    int head[2], tok_sub0[2], ntok_sub[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int j = 2 * cwg + s;
      const int hl = j / kp.chunks, chunk = j - hl * kp.chunks;
      head[s] = tile.head0 + hl;
      tok_sub0[s] = tile.tok0 + chunk * kSubRows;
      ntok_sub[s] = max(0, min(kSubRows, tile.ntok - chunk * kSubRows));
    }
    // Per sub-tile: the output at its first token (column 0 of its head), and the keys each of
    // this thread's two rows sees.
    float* out_row[2];
    int lim_row[2][2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      out_row[s] =
          p.out + int64_t(head[s]) * p.max_k_tiles * total_q + tile.row_begin + (tok_sub0[s] - tile.tok0);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        lim_row[s][h] =
            col_limit(p.causal, tile.q_off, tok_sub0[s] + 16 * warp + (lane >> 2) + 8 * h, tile.seqlen_k);
    }
    // Columns [t_end, col_end) hold no visible key of any token of the tile.
    {
      const int tok = wtid & 63;
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        if (tok >= ntok_sub[s]) continue;
        for (int t = tile.t_end + (wtid >> 6); t < tile.col_end; t += 2)
          __stcs(out_row[s] + int64_t(t) * total_q + tok, neg_inf_f());
      }
    }
    const int n = __shfl_sync(0xFFFFFFFFu, tile.t_end - tile.t_begin, 0);
    if (n <= 0) return;
    const int qs = int(nq % kQSlots);
    mbar_wait_loop(q_full(qs), (nq / kQSlots) & 1u);
    const uint32_t q0 = sQ + uint32_t(qs) * kQTileBytes + uint32_t(2 * cwg) * kSubTileBytes;
    const uint32_t q1 = q0 + kSubTileBytes;
    auto k_stage = [&](int i) { return sK + uint32_t((nk + uint32_t(i)) % kKStages) * kKBlockBytes; };
    auto wait_k = [&](int i) {
      const uint32_t c = nk + uint32_t(i);
      mbar_wait_loop(k_full(int(c % kKStages)), (c / kKStages) & 1u);
    };
    float acc0[16][4], acc1[16][4];
    uint32_t qa0[8][4], qa1[8][4];  // kRegs: A fragments of both sub-tiles, for the whole tile
    uint32_t row_exp = 0u;          // kFp8F16: the rows' down-scale exponents (sub-tile 1 in bits 16-31)
    if constexpr (kFmt == KFormat::kFp8Q) {
      const uint8_t* raw_q = smem + L::kQOffset + qs * kQTileBytes + (2 * cwg) * (kSubRows * kHeadDim);
      load_q_fragments_fp8(qa0, raw_q, warp, lane);
      load_q_fragments_fp8(qa1, raw_q + kSubRows * kHeadDim, warp, lane);
      mbar_arrive(q_empty(qs));  // the slot is free for the next tile's Q
    } else if constexpr (kQ == QSource::kRegs) {
      load_q_fragments(qa0, q0, warp, lane);
      load_q_fragments(qa1, q1, warp, lane);
      mbar_arrive(q_empty(qs));  // the slot is free for the next tile's Q
      if constexpr (kFmt == KFormat::kFp8F16) row_exp = q_fragments_to_f16(qa0) | (q_fragments_to_f16(qa1) << 16);
    }
    // One block: issue both sub-tiles' MMAs in this warpgroup's turn, reduce sub-tile 0 while 1
    // multiplies, then 1 (while the other warpgroup's MMAs run). Nothing stays in flight past a
    // step, so the blocks every token sees in full (no mask) and the rest (masked) run in two
    // loops of straight-line steps (ptxas serializes all wgmmas when accumulators are read in a
    // branch, or in a loop with a wgmma in flight across its back edge).
    auto step = [&]<bool kMasked>(int i) {
      const bool has_page = !kp.paged || kv_page(p.kv, tile.b, tile.t_begin + i) >= 0;
      wait_k(i);
      // Issue turns alternate between the two consumer warpgroups, so that one's epilogue runs
      // while the other's MMAs keep the tensor cores busy.
      named_barrier_sync(kOrderBarrier + cwg);
      if constexpr (kQ == QSource::kRegs) {
        issue_qk_rs<Mma>(acc0, qa0, k_stage(i));
        issue_qk_rs<Mma>(acc1, qa1, k_stage(i));
      } else {
        issue_qk<Mma>(acc0, q0, k_stage(i));
        issue_qk<Mma>(acc1, q1, k_stage(i));
      }
      named_barrier_arrive(kOrderBarrier + (cwg ^ 1));
      wgmma_wait<1>();
      wgmma_fence_operand(acc0);
      constexpr bool kRowScale = kFmt == KFormat::kFp8F16;
      store_block_max<kMasked, kQConvert, kRowScale>(acc0, out_row[0], total_q, lim_row[0], ntok_sub[0],
                                                     tile.t_begin + i, has_page, warp, lane, lscale, row_exp);
      wgmma_wait<0>();
      wgmma_fence_operand(acc1);
      mbar_arrive(k_empty(int((nk + uint32_t(i)) % kKStages)));  // both sub-tiles are done with block i
      store_block_max<kMasked, kQConvert, kRowScale>(acc1, out_row[1], total_q, lim_row[1], ntok_sub[1],
                                                     tile.t_begin + i, has_page, warp, lane, lscale,
                                                     row_exp >> 16);
    };
    // The first n_full blocks of the item hold only keys every token of the tile sees.
    const int n_full =
        __shfl_sync(0xFFFFFFFFu, max(0, min(n, tile.lim_first / kBlockSize - tile.t_begin)), 0);
    int i = 0;
#pragma unroll 1
    for (; i < n_full; ++i) step.template operator()<false>(i);
#pragma unroll 1
    for (; i < n; ++i) step.template operator()<true>(i);
    if constexpr (kQ == QSource::kSmem) mbar_arrive(q_empty(qs));
    nk += uint32_t(n);
    ++nq;
  });
  if (cwg == 0) named_barrier_sync(kOrderBarrier);
  fill_uncovered_rows(p, ctid);
#else
  __trap();  // launched only on sm_90 devices, where the sm_90a image is chosen
#endif
}

inline CUtensorMapDataType tensor_map_type(DType d) {
  return d == DType::kFP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// The operand format of a call (KFormat), or false where this kernel does not compute it:
// bf16 / fp16 q with K of q's dtype (kNative), fp8 K (kFp8), or NVFP4 q and K with a positive
// finite logit_scale (kNvfp4); flat or paged, per-head output. The caller then takes the mma.sync
// kernel. (The converting formats were a forced option until the H200 run of c7709c9 showed them
// correct and faster: docs/design/proxy_score.md.)
inline bool operand_format(const ProxyScoreParams& p, KFormat& fmt) {
  const bool q16 = p.q_dtype == DType::kBF16 || p.q_dtype == DType::kFP16;
  if (q16 && p.k.dtype == p.q_dtype) {
    fmt = KFormat::kNative;
  } else if (q16 && p.k.dtype == DType::kFP8E4M3) {
    fmt = KFormat::kFp8;
  } else if (p.q_dtype == DType::kFP8E4M3 && p.k.dtype == DType::kFP8E4M3) {
    fmt = KFormat::kFp8Q;  // launched only where the plan asks (fp8_q)
  } else if (p.q_dtype == DType::kNVFP4 && p.k.dtype == DType::kNVFP4 && p.q_scale != nullptr &&
             p.k.scale != nullptr && p.logit_scale > 0.0f && std::isfinite(p.logit_scale)) {
    fmt = KFormat::kNvfp4;
  } else {
    return false;
  }
  return true;
}

inline bool supports(const ProxyScoreParams& p) {
  KFormat fmt;
  const bool k_ok =
      p.kv.paged ? p.kv.num_pages > 0 : p.kv.total_k > 0 && p.kv.total_k < (int64_t(1) << 31) - kBlockSize;
  return operand_format(p, fmt) && k_ok && p.num_kv_heads > 0 && p.num_heads % p.num_kv_heads == 0 &&
         !p.reduce_heads && p.total_q < (int64_t(1) << 31) - 256;
}

template <typename Elem, KFormat kFmt>
bool launch_format(const ProxyScoreParams& p, QSource q_source, cudaStream_t stream) {
  // kFp8F16 and kFp8Q make Q's fp16 fragments in registers: no shared-memory-Q instantiation.
  constexpr bool kRegsOnly = kFmt == KFormat::kFp8F16 || kFmt == KFormat::kFp8Q;
  constexpr QSource kSmemQ = kRegsOnly ? QSource::kRegs : QSource::kSmem;
  if constexpr (kRegsOnly) q_source = QSource::kRegs;
  auto kernel = q_source == QSource::kRegs ? proxy_score_sm90_kernel<Elem, QSource::kRegs, kFmt>
                                           : proxy_score_sm90_kernel<Elem, kSmemQ, kFmt>;
  const int smem_bytes = q_source == QSource::kRegs ? Layout<QSource::kRegs, kFmt>::kSmemBytes
                                                    : Layout<kSmemQ, kFmt>::kSmemBytes;
  if (prepare_sm90a_launch(kernel, kThreads, size_t(smem_bytes)) <= 0) return false;
  // TMA: 16-byte aligned base and strides (the mma.sync kernel's cp.async needs the same). Strides
  // are in elements: 2 bytes for 16-bit operands, 1 for fp8 and NVFP4 (bytes).
  const int64_t q_elt = is_fp4(kFmt) || kFmt == KFormat::kFp8Q ? 1 : 2;
  const int64_t k_elt = kFmt == KFormat::kNative ? 2 : 1;
  auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (!aligned16(p.q) || !aligned16(p.k.data) || (p.q_stride_token * q_elt) % 16 != 0 ||
      (p.q_stride_head * q_elt) % 16 != 0 || (p.k.stride_token * k_elt) % 16 != 0 ||
      (p.k.stride_head * k_elt) % 16 != 0 || (p.k.stride_page * k_elt) % 16 != 0)
    return false;
  if (p.total_q <= 0 || p.max_k_tiles <= 0) return true;  // an empty output: nothing to write

  Params kp{};
  kp.p = p;
  kp.group_size = p.num_heads / p.num_kv_heads;
  kp.heads_per_cta = kp.group_size % 4 == 0 ? 4 : (kp.group_size % 2 == 0 ? 2 : 1);
  kp.chunks = kSubTiles / kp.heads_per_cta;
  kp.num_groups = p.num_kv_heads * (kp.group_size / kp.heads_per_cta);
  int64_t max_seqlen_q = p.qi.max_seqlen_q;
  if (max_seqlen_q <= 0 || max_seqlen_q > p.total_q) max_seqlen_q = p.total_q;
  const int tile_tokens = kSubRows * kp.chunks;
  kp.n_qt = int(std::max<int64_t>(1, ceil_div_int<int64_t>(max_seqlen_q, tile_tokens)));
  // Key-block chunks per item. With at least 2 tiles per SM the snake order balances the causal
  // triangle on whole tiles (a host model of it: within ~1 % at 32K and 128K, M3). With fewer
  // (8K: 128 tiles for 132 SMs) a tile's blocks are cut into chunks of about 1/24 of an SM's share
  // of the estimated work (at least 4 blocks, a Q load per 4 x 32 KB of K): the model puts the
  // most loaded SM within ~2-4 % of the mean from 4K to 16K.
  const DeviceLimits& limits = current_device_limits();
  const int64_t P = p.max_k_tiles;
  const int64_t tiles = int64_t(kp.n_qt) * std::max(p.batch, 1) * kp.num_groups;
  const int64_t units = tiles * (p.causal ? (P + 1) / 2 : P);
  kp.split_blocks = int(
      tiles >= 2LL * limits.num_sms
          ? P
          : std::min<int64_t>(P, std::max<int64_t>(4, ceil_div_int<int64_t>(units, 24LL * limits.num_sms))));
  kp.n_split = int(ceil_div_int<int64_t>(P, kp.split_blocks));
  kp.n_items = int64_t(kp.n_qt) * p.batch * kp.num_groups * kp.n_split;

  kp.paged = p.kv.paged;
  if constexpr (is_fp4(kFmt)) {
    // Raw NVFP4 q: 64-byte rows, one box per sub-tile, 64-byte swizzle (the converters' layout).
    const uint64_t q_dims[3] = {kHeadDim / 2, uint64_t(p.num_heads), uint64_t(p.total_q)};
    const uint64_t q_strides[2] = {uint64_t(p.q_stride_head), uint64_t(p.q_stride_token)};
    const uint32_t q_box[3] = {kHeadDim / 2, 1, kSubRows};
    if (!encode_tensor_map(kp.q_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.q, 3, q_dims, q_strides, q_box,
                           CU_TENSOR_MAP_SWIZZLE_64B))
      return false;
  } else if constexpr (kFmt == KFormat::kFp8Q) {
    // Raw e4m3 q: 128-byte rows, one box per sub-tile, 128-byte swizzle (load_q_fragments_fp8).
    const uint64_t q_dims[3] = {kHeadDim, uint64_t(p.num_heads), uint64_t(p.total_q)};
    const uint64_t q_strides[2] = {uint64_t(p.q_stride_head), uint64_t(p.q_stride_token)};
    const uint32_t q_box[3] = {kHeadDim, 1, kSubRows};
    if (!encode_tensor_map_sw128(kp.q_map, CU_TENSOR_MAP_DATA_TYPE_UINT8, p.q, 3, q_dims, q_strides, q_box))
      return false;
  } else {
    const uint64_t q_dims[3] = {kHeadDim, uint64_t(p.num_heads), uint64_t(p.total_q)};
    const uint64_t q_strides[2] = {uint64_t(p.q_stride_head) * 2, uint64_t(p.q_stride_token) * 2};
    const uint32_t q_box[3] = {64, 1, kSubRows};
    if (!encode_tensor_map_sw128(kp.q_map, tensor_map_type(p.q_dtype), p.q, 3, q_dims, q_strides, q_box))
      return false;
  }
  // K: 16-bit as two 64-dim boxes per block (128-byte swizzle); fp8 (128-byte rows) / NVFP4 (64-byte
  // rows) as one box of raw bytes, swizzled at the row width.
  const CUtensorMapDataType k_ty = kFmt == KFormat::kNative ? tensor_map_type(p.q_dtype) : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const uint32_t k_row = kFmt == KFormat::kNative ? kHeadDim : is_fp8_k(kFmt) ? kHeadDim : kHeadDim / 2;
  const uint32_t k_box0 = kFmt == KFormat::kNative ? 64 : k_row;
  const CUtensorMapSwizzle k_swizzle = is_fp4(kFmt) ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
  if (!encode_kv_block_map(kp.k_map, k_ty, p.k, p.kv, p.num_kv_heads, k_row, k_box0, int(k_elt), k_swizzle))
    return false;

  const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(kp.n_items, limits.num_sms));
  kernel<<<unsigned(grid), kThreads, smem_bytes, stream>>>(kp);
  MSA_CHECK_LAUNCH();
  return true;
}

template <typename Elem>
bool launch(const ProxyScoreParams& p, QSource q_source, bool f16_mma, bool fp8_q, cudaStream_t stream) {
  KFormat fmt;
  if (!supports(p) || !operand_format(p, fmt)) return false;
  switch (fmt) {
    case KFormat::kFp8Q:
      // fp8 q and K (the api's bf16 instantiation): only where the plan asks (ProxyScorePlan::fp8_q).
      if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
        if (fp8_q) return launch_format<Elem, KFormat::kFp8Q>(p, QSource::kRegs, stream);
      return false;
    case KFormat::kNative: return launch_format<Elem, KFormat::kNative>(p, q_source, stream);
    case KFormat::kFp8:
      // fp16 q already multiplies in fp16; f16_mma changes bf16 q only.
      if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
        if (f16_mma) return launch_format<Elem, KFormat::kFp8F16>(p, QSource::kRegs, stream);
      return launch_format<Elem, KFormat::kFp8>(p, q_source, stream);
    case KFormat::kFp8F16:
    case KFormat::kNvfp4F16: return false;  // not operand formats (operand_format never returns them)
    case KFormat::kNvfp4:
      // NVFP4 computes in bf16 (proxy_score_api.cu), or with f16_mma on fp16 MMAs (kNvfp4F16); no
      // fp16 instantiation.
      if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
        if (f16_mma) return launch_format<Elem, KFormat::kNvfp4F16>(p, q_source, stream);
        return launch_format<Elem, KFormat::kNvfp4>(p, q_source, stream);
      }
      return false;
  }
  return false;
}

}  // namespace flashmsa::cuda::proxy::sm90
