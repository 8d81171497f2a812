// Tile shapes, shared memory plan and kernel parameters of msa_proxy_score on SM80+ (mma.sync).
// docs/design/proxy_score.md explains the schedule and the numbers chosen here.
#pragma once

#include <cstdint>

#include "flashmsa/params.h"
#include "flashmsa/types.h"

namespace flashmsa::cuda::proxy {

inline constexpr int kThreads = 128;  // 4 warps: one per SM sub-partition
inline constexpr int kWarps = kThreads / 32;
// K pipeline depth: 2 blocks in flight while one is multiplied. 3 x 32 KB keeps two CTAs per SM
// on H100/H200 (2 x 98 KB of 228 KB) and is far more than the ~50 KB per SM that saturates HBM.
inline constexpr int kStages = 3;
inline constexpr int kKTileBytes = kBlockSize * kHeadDim * 2;  // one block of 16-bit keys: 32 KB
inline constexpr int kRawTileBytes = kBlockSize * kHeadDim;    // one block of fp8 keys: 16 KB
// Heads of one KV group a CTA covers. Groups larger than this are split into ceil(G / 16) CTAs
// (or loop iterations with reduce_heads); 16 keeps every tile shape below able to hold one token.
inline constexpr int kMaxHeadsPerCta = 16;
// A key-block split below this many blocks would spend more on the Q load than on the keys.
inline constexpr int kMinBlocksPerSplit = 4;

// The MMA tile of a CTA: rows = (heads of the group) x (consecutive tokens), head-major; keys are
// the 128 of one block. A warp owns kMTiles m16 row tiles and kBlockSize / kWarpsN keys.
//   Large  (4 m-tiles, 1 warp per block): 256 rows, every warp multiplies all 128 keys; a warp's
//          64 rows share each K fragment it loads (16 B of smem per 4 KFLOP: compute-bound).
//   Medium (2, 2): 64 rows; two warps per row set, each on 64 keys of the block.
//   Small  (1, 4): 16 rows (decode: 1..16 / G tokens); four warps split the 128 keys of a block
//          and their row maxima are combined through shared memory.
// A sequence uses the smallest shape that holds all its rows, so a decode token never pays for a
// 256-row tile, and mixed prefill + decode batches run in one launch.
template <int kMTiles_, int kWarpsN_>
struct TileShape {
  static constexpr int kMTiles = kMTiles_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kWarpsM = kWarps / kWarpsN;
  static constexpr int kRows = kWarpsM * kMTiles * 16;
  static constexpr int kKeysPerWarp = kBlockSize / kWarpsN;
  static constexpr int kKeyChunks = kKeysPerWarp / 16;  // 16-key steps per warp per block
  static_assert(kWarps % kWarpsN == 0 && kKeysPerWarp % 16 == 0, "bad tile shape");
};
using SmallTile = TileShape<1, 4>;
using MediumTile = TileShape<2, 2>;
using LargeTile = TileShape<4, 1>;

// One struct per kernel (STYLE habit 10). `tiles` is reused on purpose:
//   16-bit K:  stage s at [s * 32 KB, +32 KB)
//   fp8 K:     raw stage s at [s * 16 KB, +16 KB), the converted 16-bit block at [48 KB, 80 KB)
//   NVFP4 K:   the same, a raw stage holding 8 KB of e2m1 pairs and 1 KB of scales
//   Q staging: [0, rows * 256 B) before the K pipeline of a tile starts (Q then lives in registers)
// `part` holds per-warp row maxima of a block, double-buffered so that block t is finalised while
// block t + 1 is multiplied (one __syncthreads per block).
// `state` describes the tile and KV group being computed. It lives in shared memory rather than in
// registers on purpose: the Large tile keeps 32 x kMTiles Q fragment registers live across the
// whole K pipeline, and ~20 scalars held next to them would push the kernel into spills; read
// from shared memory after each barrier they cost a few LDS per 128-key block instead.
struct TileState {
  int64_t row_begin;  // global q row of token tok0
  int64_t q_off;      // global position of local query 0 of the sequence
  int b;              // sequence
  int seqlen_k;
  int tok0;         // first token of the tile (local index in the sequence)
  int ntok;         // tokens in the tile (<= T)
  int T;            // tokens per tile for this shape: rows = (head r / T, token r % T)
  int head0;        // first query head of the KV group slice
  int nh;           // heads in the slice (<= heads_per_cta)
  int kh;           // KV head
  int t_begin;      // first key block computed
  int n_blocks;     // key blocks computed: [t_begin, t_begin + n_blocks)
  int lim_first;    // keys [0, lim_first) are visible to every row of the tile
  int first_group;  // reduce_heads: 1 for the first group (stores), 0 after (max with stored)
};

struct SharedStorage {
  alignas(128) uint8_t tiles[kStages * kKTileBytes];
  alignas(16) float part[2][LargeTile::kRows];
  TileState state;
};
static_assert(kStages * kRawTileBytes + kKTileBytes <= kStages * kKTileBytes, "fp8 plan overflows");
// NVFP4 K raw stage: 128 rows x 64 bytes of e2m1 pairs, then 128 x 8 scale bytes, in an fp8 slot.
inline constexpr int kFp4RawDataBytes = kBlockSize * kHeadDim / 2;
static_assert(kFp4RawDataBytes + kBlockSize * 8 <= kRawTileBytes, "NVFP4 raw stage overflows");
static_assert(LargeTile::kRows * kHeadDim * 2 <= kStages * kKTileBytes, "Q staging overflows");
static_assert(SmallTile::kRows * SmallTile::kWarpsN <= LargeTile::kRows &&
                  MediumTile::kRows * MediumTile::kWarpsN <= LargeTile::kRows,
              "part[] too small");

// Params of the kernel: the validated op params plus the launch plan computed on the host.
struct KernelParams {
  ProxyScoreParams p;
  int group_size;     // G = Hq / Hkv
  int heads_per_cta;  // hc <= 16: heads of one CTA's tile
  int subgroups;      // ceil(G / hc): CTAs (or iterations) per KV head
  int num_groups;     // Hkv * subgroups; gridDim.y, or looped inside the CTA with reduce_heads
  int n_qt;           // Large q-tiles per sequence in the grid (more are grid-strided)
  int n_split;        // key-block splits per q-tile
  int blocks_per_split;
  int64_t n_work;  // n_qt * batch * n_split work items, then n_fill fill items
  int n_fill;      // items writing -inf to rows outside [cu_seqlens_q[0], cu_seqlens_q[B])
  bool q_fp8;
  bool k_fp8;
  bool q_fp4;  // NVFP4 q and k (msa_proxy_score_fp4): dequantized exactly into the MMA dtype,
  bool k_fp4;  // every logit times p.logit_scale before the block max
};

}  // namespace flashmsa::cuda::proxy
