// Plans of the ops: how one call runs (schedule, kernel, grids, workspace layout).
//
//   options (what the caller forces; `auto` everywhere is the library's own choice)
//   + validated Params + device facts (CTAs per SM of each kernel variant, SMs)  ->  a plan
//
// The planner is host-only and pure: the CUDA side queries the device facts of a call and passes
// them in, so every choice below builds and is unit-tested without a GPU. A call is planned once:
// the binding asks for the plan, provides `plan.bytes` of device scratch, and runs with that plan.
// A new kernel variant is one enumerator of its op's kernel enum (with its option name in
// plan.cpp), one fact, and one case in its op's planner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "flashmsa/params.h"

namespace flashmsa {

// ---- options -----------------------------------------------------------------------------------
// Options arrive as text "name=value,name=value" (the private plan argument of the torch ops);
// parse_*_options rejects an unknown name or a bad value with a ValueError naming the option.

// Prefill schedules (docs/design/sparse_attention.md): query_major (one CTA per token and kv
// head), kv_major (one CTA per selected block, partials + combine), hybrid (shared-selection tiles
// for the tiles that qualify, KV-major for the rest; KV-major alone where the tile kernel cannot
// run). auto: query_major below kKvMajorMinRows rows, else hybrid (query_major when the KV-major
// kernel does not fit the GPU).
enum class PrefillSchedule : int32_t { kAuto = 0, kQueryMajor = 1, kKvMajor = 2, kHybrid = 3 };
// KV-major attention kernels: mma_sync (portable SM80+), wgmma (sm_90a warpgroup MMAs), tma (sm_90a
// in FlashAttention-3's structure: a TMA producer warp, the next item's K/V prefetched, a 4-stage
// query ring, two consumer warpgroups with S of the next tile in flight during the softmax,
// partials written by TMA stores; kv_major_tma_sm90.cuh). tma needs bf16 / fp16 K and V of the
// compute dtype, G a multiple of 8 that divides 64 or is a multiple of 64, and q / K/V / partial
// rows within TMA's coordinates; elsewhere it falls back to wgmma (else mma_sync) and the plan text
// says why. Measured slower than wgmma (H200 at 3cebf5e: 32K random 11.84 vs 9.90 ms; two consumer
// warpgroups hide the per-tile softmax chain worse than wgmma's four: docs/design/
// sparse_attention.md#kv-major-tma). auto: wgmma where it can run, else mma_sync (tma only when
// named).
enum class KvMajorKernel : int32_t { kAuto = 0, kMmaSync = 1, kWgmma = 2, kTma = 3 };
// How the sm_90a warpgroup-MMA KV-major kernel (kv_major_kernel=wgmma, auto's on Hopper) writes its
// partials: stg (each lane's 16-byte stores) or tma (two TMA stores per warp and tile from the
// staged tile; G a multiple of 16, else stg). auto: tma where it applies (H200 at 73ba220: KV-major
// alone 32K random 7824 vs 8335 us, the default schedule 7664 vs 7887, clustered 3777 vs 3986),
// else stg.
enum class KvMajorStore : int32_t { kAuto = 0, kStg = 1, kTma = 2 };
// That kernel's per-row math after the softmax: precise (the partial LSE's log2 by log2f, 1 / l
// correctly rounded) or approx (both by the special-function unit: MUFU.LG2 / MUFU.RCP, at most
// ~2^-22 absolute / 1 ulp off; ~50 fewer instructions per warp and 64-row tile; the partials' and
// LSEs' last bits differ from precise's, deterministic). auto: approx on that kernel (H200 at
// 0b8aa64: the default schedule at 32K random 7482 vs 7747 us, KV-major alone 7626 vs 7808).
enum class KvMajorMath : int32_t { kAuto = 0, kPrecise = 1, kApprox = 2 };
// KV-major work lists (docs/design/sparse_attention.md#work-lists): per_group (count, scan and
// scatter before each launch group's attention kernel), once (the lists of every launch group
// built by one count, one scan of a CTA per group and one scatter before the first group; each
// group then runs only its attention kernel and its combine). once needs every group's counters,
// cursors, items and list at the same time; where those would exceed kKvMajorListsOnceBudget bytes
// the plan keeps per_group (a forced once says so in the plan text). auto: once where it fits
// (H200 at 7cbcfcc: M3 32K random 9.66 vs 9.94 ms, 8K pipeline selections 1.93 vs 1.99 ms).
enum class KvMajorLists : int32_t { kAuto = 0, kPerGroup = 1, kOnce = 2 };
// Shared-selection tile kernels (sm_90a, docs/design/sparse_attention.md): cp_async (a producer
// warpgroup of cp.async loads, one block's S, softmax and P V after another: union_sm90.cuh; bf16
// / fp16 / fp8 K and V), tma (TMA loads by one producer warp, S of the next block and P V of the
// last one in flight while the softmax runs: union_tma_sm90.cuh; bf16 / fp16 K and V). tma where
// it cannot run (fp8 K/V, the device, K/V or q beyond TMA's 32-bit coordinates) falls back to
// cp_async and the plan text says why. auto: tma where it runs, else cp_async (H200 at d865e57, M3
// 32K clustered bf16: 4.03 vs 5.24 ms flat, 4.02 vs 5.28 ms paged; 8K pipeline selections 1.96 vs
// 2.20 ms).
enum class TileKernel : int32_t { kAuto = 0, kCpAsync = 1, kTma = 2 };
// The shared-selection tiles' waste bound (docs/design/sparse_attention.md#tile-waste): fixed (the
// bound of the call, tile_max_waste or the default), or adaptive: a tile qualifies at that bound
// and also at 3.0 when the tiles within 3.0 hold at least 97 % of the call's pairs (decided on the
// device from the call's own selections: with nearly every pair in tiles the KV-major path and its
// fixed costs vanish, which is where 3.0 won on pipeline selections from 12K to 40K rows while it
// lost on random ones). auto: adaptive with the TMA tiles' default bound from 8193 to 40960 query
// rows, else fixed (H200 at b5b8409: pipeline selections 16K 3.39 vs 3.67 ms of kernels, 32K 8.09
// vs 8.18; random +0.6 %).
enum class TileBound : int32_t { kAuto = 0, kFixed = 1, kAdaptive = 2 };
// Proxy-score kernels (docs/design/proxy_score.md): mma_sync (portable SM80+, every call), sm90 /
// sm90_ss (the sm_90a TMA + wgmma prefill kernel with Q in registers / in shared memory, where it
// applies: bf16 / fp16 q with K of q's dtype or fp8 K, or NVFP4 q and K (converted exactly into
// 16-bit by its producer warpgroup), no reduce_heads, an sm_90 device; elsewhere mma_sync), decode
// (the SM80+ streaming kernel for short queries: csrc/proxy_score/proxy_decode.cuh, where
// proxy_decode_runs; elsewhere mma_sync), and the _only forms of the last three (the same without
// the fallback: NotImplementedError where the kernel does not apply; tests and benchmarks).
// decode_f16 / decode_f16_only: the decode kernel with fp16 MMAs for fp8 K with bf16 or fp8 q
// (ProxyScorePlan::f16_mma; otherwise the same as decode / decode_only). sm90_f16 / sm90_f16_only:
// the sm_90a kernel with fp16 MMAs for fp8 K with bf16 q (Q in registers, its rows scaled into
// fp16 by powers of two), for fp8 q and K (ProxyScorePlan::fp8_q: Q's raw bytes by TMA, converted
// exactly in registers; auto's too since the H200 run at 831d3e5) and for NVFP4 q and K (value x
// 2^-7); otherwise the same as sm90 / sm90_only.
// auto: decode where proxy_auto_takes_decode (short queries: one 16-row pass per key block; with
// fp16 MMAs for fp8 K, as decode_f16), else
// sm90 (which itself falls back to mma_sync where it does not apply; fp8 K with bf16 q on its fp16
// MMAs, as sm90_f16, since b66f97b: 874.8 vs 1067.6 us at 32K; NVFP4 q and K likewise since the H200
// run at 5cb9800: 1352.0 vs 1805.0 us; fp8 q and K likewise since the H200 run at 831d3e5: 854.3
// vs 1736.5 us). H200 at 162e97a: 32K prefill
// 658 us vs mma_sync 1624; decode B64/32K 139 vs 190 us (bf16), 125 vs 216 (fp8), 145 vs 271 (NVFP4);
// at c7709c9, 32K prefill with fp8 K 1076 vs 1739 us, NVFP4 q / K 1806 vs 2038 us (auto took
// mma_sync for them until then).
enum class ProxyKernel : int32_t {
  kAuto = 0,
  kMmaSync = 1,
  kSm90 = 2,
  kSm90Only = 3,
  kSm90Ss = 4,
  kSm90SsOnly = 5,
  kDecode = 6,
  kDecodeOnly = 7,
  kDecodeF16 = 8,
  kDecodeF16Only = 9,
  kSm90F16 = 10,
  kSm90F16Only = 11
};
// Top-k kernels (docs/design/topk_select.md): warp_per_row (a warp per (token, head) row, bitwise
// threshold search, 32 tokens per CTA), warp_per_row_8 (the same at 8 tokens per CTA: 4x the CTAs,
// for calls of a few hundred rows), radix (a lane per row, radix select: for many rows),
// radix_1buf (the radix kernel with the lean trims: the first chunk of a row without compaction,
// warp-uniform insertion, the radix select started at the keys' range, at most one float exponent
// a bin; and one chunk buffer per warp: 13 warps per SM at topk 16 instead of 8), warp_split (a
// CTA per row, the row's 256-block chunks split over up to 8 warps, then one warp merges their
// choices: for decode-sized calls), warp_digits (warp_split with one-chunk rows' thresholds by
// 8-bit radix digits), radix_uniform (radix_1buf with its passes branch-free and
// their trip counts warp-uniform: less lane divergence), and by_size (radix_uniform from
// kTopkRadixMinGroupsPerSm groups of 32 tokens per SM on; below it warp_split up to
// kTopkSplitMaxRowsPerSm rows per SM, as warp_digits where every row is one chunk, else
// warp_per_row_8).
// auto: by_size (H200 at 162e97a: 152 vs 193 us at prefill 32K, 1615 vs 2956 us at 4 x 128K x 1024
// blocks, 10.0 vs 21.5 us for 64 tokens x 4 heads x 256 blocks, against warp_per_row; at 5b22cb3
// radix_1buf for the large calls: 102 vs 152 us at 32K, 1025 vs 1606 us at 128K, against radix
// (radix_lean 113 / 1228, radix_c32 129 / 1099: both removed)); at 2f7070a warp_split for the
// small calls: 10.8 vs 20.9 us for 1 token x 4 heads x 1024 blocks (B1 / 128K decode), 9.1 vs
// 9.8 us for 64 tokens x 4 heads x 256 blocks, against warp_per_row_8; at a1af6c4 radix_uniform
// for the large calls: 86.2 vs 99.3 us at 32K, 869.5 vs 1022.8 us at 128K, against radix_1buf;
// at 3cebf5e warp_digits for the small calls of one-chunk rows: 8.2 vs 9.1 us for 64 tokens x 4
// heads x 256 blocks, against warp_split. Since the H200 run at 3488394: net wherever it runs (rows
// choosing at most 31 blocks of at most 32768), by_size elsewhere (net against by_size: prefill
// 32K 69.8 vs 86.4 us, 4 x 128K x 1024 459.8 vs 869.6 us, 1 x 4 x 1024 8.5 vs 10.4 us, 64 x 4 x
// 256 8.2 vs 8.5 us).
enum class TopkKernel : int32_t {
  kAuto = 0,
  kWarpPerRow = 1,
  kWarpPerRow8 = 2,
  kRadix = 3,
  kBySize = 4,
  // 5 and 7 were radix_lean and radix_c32 (removed).
  kRadix1Buf = 6,
  kWarpSplit = 8,
  // 9 and 10 were warp_pivot and radix_ilp (removed).
  kRadixUniform = 11,
  // 12 was radix_coop (cooperative histograms; H200 at 054c9ce: 86.6 vs 86.3 us at 32K, 31.2 vs
  // 28.5 us for 64 tokens x 4 heads x 256 blocks, against radix_uniform; removed).
  // warp_digits: warp_split with a one-chunk row's (<= 256 candidates) exact threshold found by
  // 8-bit radix digits of its order keys (<= 4 passes of a 256-bin histogram and a warp scan)
  // instead of the bitwise search (~15-20 dependent steps), one warp a CTA where num_blocks <= 256;
  // rows of several chunks run warp_split unchanged. by_size takes it in place of warp_split where
  // num_blocks <= kTopkDigitsChunk (H200 at 3cebf5e: 8.2 vs 9.1 us at 64 x 4 x 256).
  kWarpDigits = 13,
  // net: a lane (or a team of L lanes, a power of two) per row keeps its share's best candidates
  // as the K smallest 32-bit words (order key with its low bits replaced by the block's offset:
  // min / max are whole compare-exchanges) by a 16-input sorting network and a bitonic merge per
  // 16 blocks; the teams merge by shuffles; an exact second pass resolves a tie of truncated keys
  // across the cut. Rows choosing at most kTopkNetMaxCarry blocks over at most kTopkNetMaxSpan
  // blocks; elsewhere the option falls back to by_size's choice (the plan text says why). auto's
  // kernel where it runs since the H200 run at 3488394.
  kNet = 14
};
// by_size: a lane's row is a serial chain in the radix kernel, so it needs this many groups of 32
// tokens (32 rows, one warp) per SM to fill the GPU; below it warp_per_row_8 spreads each row over
// a warp.
inline constexpr int kTopkRadixMinGroupsPerSm = 4;
// by_size below the radix threshold: warp_split (a 256-thread CTA per row, 4 CTAs per SM by its 64
// registers) while the rows fit one wave of it, the decode calls measured (4 and 256 rows); more
// rows of one chunk would leave 7 of its 8 warps idle, so they keep warp_per_row_8.
inline constexpr int kTopkSplitMaxRowsPerSm = 4;
// warp_digits: rows of at most this many candidates (one chunk of the split kernel) take the digit
// threshold; where num_blocks is at most this every row does, and a CTA is one warp.
inline constexpr int kTopkDigitsChunk = 256;
// net: the words of a lane (K = 16, or 32 where a row chooses more than 15) must exceed the
// candidates a row chooses (topk - force_begin - force_end), and a block's offset in the warp's
// candidate range must fit 15 bits.
inline constexpr int kTopkNetMaxCarry = 31;
// The most candidates a row of the call chooses by score (its carry): topk less the forced blocks
// (a row whose nvp clamps the forced ones has no candidates at all).
inline int topk_carry(const TopkSelectParams& p) { return p.topk - p.force_begin - p.force_end; }
inline constexpr int kTopkNetMaxSpan = 1 << 15;
// net: lanes per row, the fewest (a power of two up to 32) that give at least this many warps per
// SM, and no more than one per 16 blocks of a row (a lane's share is at least one network batch).
// H200 at b0792fd: 32K (131K rows: 31 warps per SM at one lane) 43.6 us at 2 lanes against 58.3 at
// one; 128K (524K rows: 124 warps per SM) 452.6 us at one lane against 468.8 at two.
inline constexpr int kTopkNetMinWarpsPerSm = 48;
// auto takes the proxy decode kernel when each request's query rows through one KV head (G heads x
// max_seqlen_q tokens) fit one 16-row MMA pass per key block: M3's decode (G 4 x 1 token) and MTP
// up to 4 tokens, the calls measured. Without max_seqlen_q the bound is total_q (device
// cu_seqlens_q), so decode callers pass it.
inline constexpr int kProxyDecodeAutoMaxRows = 16;
// Decode kernels for 16-row tiles (G <= 16): smem (the query-major kernel as prefill runs it: fp8
// K/V dequantized in shared memory, 2 stages of bf16 / fp16 K/V), regs (the streaming variant: 3
// stages of 32 KB at 2 CTAs per SM, fp8 K/V converted in registers into fp16 MMAs; NVFP4 K/V: 5
// stages of 18 KB, converted in registers too; G > 16 keeps smem). MTP union items: regs converts
// fp8 K/V in registers (64-row tiles; the 4 warps split the keys of Q K^T and the head dims of
// P V); NVFP4 / bf16 / fp16 union items keep smem (NVFP4 in registers measured slower, 168.3 vs
// 153.1 us at 5b22cb3, and was removed).
// auto: regs for fp8 K/V (H200 at 162e97a, B64/32K: 53.5 vs 73.5 us) and NVFP4 K/V (at 1aad2ee:
// 66.7 vs 101.7 us), smem for 16-bit K/V (the two within 1%: 81.6 vs 80.9 us) but for fused calls
// whose items overrun smem's one wave and fill regs' waves better (B128 / M3: 136.9 vs 162.0 us at
// 831d3e5; decode_16bit_takes_regs); MTP union items:
// regs for fp8 K/V (at 441d02d, 4 tokens: 79.7 vs 119.7 us) where wgmma does not run, wgmma with
// fp8 K/V from more union items than half the SMs where it does (wgmma_fp8, since 831d3e5 and
// 455afa9); wgmma for 16-bit union items where
// it runs and there are more items than half the SMs (32K, 4 tokens, bf16: B64 99.0 vs 104.1 us at
// 054c9ce; B32 54.9 vs 74.1, B24 77.2 vs 93.8 at 37fd6f5; B16 even, B8 / B1 slower there); smem
// where neither applies.
// wgmma: MTP union items with bf16 / fp16 q, K and V on the sm_90a kernel of warpgroup MMAs and TMA
// loads (csrc/sparse_attn/mtp_wgmma_sm90.cuh: a persistent CTA per SM, a producer warp streaming
// each item's union blocks through a 3-stage K / V ring, one consumer warpgroup computing all 64
// rows), and fp8 K/V unless wgmma_fp8=off (DecodeWgmmaFp8); every other call (per-token items, fp8
// K/V with wgmma_fp8=off, NVFP4 K/V, fp8 q, no sm_90a image or device,
// q / K / V beyond TMA's 32-bit coordinates) is planned as auto and the plan text says why
// (mtp_wgmma_unsupported).
enum class DecodeKernel : int32_t {
  kAuto = 0,
  kSmem = 1,
  kRegs = 2,
  // 3 was regs_pipe (removed: docs/design/sparse_attention.md#decode-regs-pipe).
  kWgmma = 4
};
// MTP (seqlen_q > 1) items: per_token (an item per token), union (an item per request and kv head
// over the union of its tokens' selections, where it applies: seqlen_q 2..4, seqlen_q x G <= 64,
// seqlen_q x topk <= 64). auto: union where it applies and pays (heuristics.h mtp_union_pays, from
// the H200 runs at 4a4ffcb / 40f5475: per-token items win at small batches, e.g. B1/32K 4 tokens
// 17.6 vs 25.2 us bf16, 18.4 vs 35.7 us fp8; union at B64 82.0 vs 173 us bf16). kernel=wgmma
// takes union items under auto too (the kernel runs nothing else).
enum class DecodeMtp : int32_t { kAuto = 0, kPerToken = 1, kUnion = 2 };
// How the 16-row register kernel (kernel=regs, or auto) converts NVFP4 K/V: byte (a byte of two
// e2m1 codes at a time: extraction, spread, masks and shifts per fp16 pair), word (a 32-bit word of
// 8 codes at a time: the codes of its high and of its low nibbles by two mask/shift/merge chains,
// then one prmt or AND per fp16 pair; ~20 % fewer instructions per block, the same B values, Q K^T
// dims taken in another order). auto: word (H200 at f4fdc62, B64/32K: 61.4 vs 67.8 us; B1 30.0 vs
// 29.3 us). Other kernels and KV kinds ignore it.
enum class DecodeNvfp4Cvt : int32_t { kAuto = 0, kByte = 1, kWord = 2 };
// The proxy decode kernel's fp8 K path (option decode_fp8) and NVFP4 K path (option decode_nvfp4):
// cta (the CTA-wide cp.async ring, 4 warps splitting each key block) or tma (sm_90a: a producer warp
// loads whole key blocks with TMA into an mbarrier ring, consumer warps (fp8 6, NVFP4 12) each take
// whole blocks from their own two stages, keys on the MMA's M side; docs/design/proxy_score.md,
// "fp8 K through TMA, a warp per block" and "NVFP4 K through TMA"). A pass
// of tma covers kProxyDecodeTmaCols (8) query columns (G heads x tokens) where G x max_seqlen_q fits
// them, else kProxyDecodeTmaMaxCols (16: two MMAs per converted K fragment). auto = tma at any
// batch where G x max_seqlen_q <= kProxyDecodeTmaMaxCols (one pass of either build, as measured),
// else cta, for fp8 and NVFP4 K alike.
enum class DecodeTma : int32_t { kAuto = 0, kCta = 1, kTma = 2 };
// Who issues the proxy decode TMA kernel's loads (option decode_tma_issue): producer (a producer
// warp for the CTA, each unit once its stage's empty barrier says the consumer is done) or warps
// (each consumer warp loads its own units into the stage it has just finished: no producer warp,
// no empty barrier; docs/design/proxy_score.md, "NVFP4 K through TMA"). auto = warps for NVFP4 K
// above kProxyDecodeTmaProducerMaxUnits units (H200 at 9738086, B64 / 32K: 55.8 vs 73.4 us),
// producer for NVFP4 K up to them and for fp8 K (72.3 vs 71.4 us).
enum class DecodeTmaIssue : int32_t { kAuto = 0, kProducer = 1, kWarps = 2 };
// Units (requests x kv heads x key blocks) up to which auto keeps the producer warp for NVFP4 K:
// a CTA then holds <= ~16 blocks (132 SMs), and one warp resolving and issuing them beats each
// consumer warp doing its own. H200 at ca714f5 (us, producer vs warps): sq 1 B1 / 32K (256 units)
// 9.2 vs 10.1, B2 (512) 9.9 vs 10.3, B4 (1024) 11.8 vs 11.5, B8 (2048) 15.4 vs 16.1, B1 / 128K
// (1024) 11.8 vs 11.5, B2 / 128K (2048) 15.4 vs 15.9; sq 4 B1 13.4 vs 16.9, B4 16.3 vs 17.2, B8
// 18.6 vs 20.6; above: B16 / 32K (4096) 22.9 vs 23.0, B4 / 128K 22.9 vs 22.1, sq 4 B16 26.5 vs
// 27.8, B32 (8192) 38.4 vs 34.2, B8 / 128K 38.4 vs 32.7.
inline constexpr int64_t kProxyDecodeTmaProducerMaxUnits = 2048;
// The proxy decode kernels' units of work: requests x kv heads x key blocks (each a 128-key block
// of one request and index-K head), split over the CTAs.
inline int64_t proxy_decode_units(const ProxyScoreParams& p) {
  return int64_t(p.batch > 0 ? p.batch : 0) * p.num_kv_heads * p.max_k_tiles;
}
// Split-K decode (the plan splits each (token, kv head) row's blocks over several CTAs: small
// batches; docs/design/sparse_attention.md#decode-cluster): blocks (each split writes its partial
// to the workspace, the combine kernel merges them), cluster (the splits of a row run as one
// thread-block cluster, sm_90: each CTA keeps its partial in shared memory and after a cluster
// barrier the CTAs merge the row's heads in parallel through distributed shared memory with the
// combine's own code and slot order, so the results are bit-identical to blocks; at most 16 splits
// (the largest cluster; 8 where the device allows no larger), no workspace, no combine launch).
// cluster falls back to blocks for MTP union items and where clusters cannot run (the plan text
// says why); calls that do not split ignore it. Where the 8-warp kernel applies (split_warps,
// below) the cluster runs on it (query_major_wide.cuh: each CTA on an SM of its own, the split
// count planned for one CTA per SM; bit-identical to blocks on 8 warps with the same split count),
// elsewhere on the 4-warp kernel (whose clusters may pack 2-3 CTAs onto an SM). auto: blocks (H200
// at a1af6c4, 4-warp clusters: eager B1 / 32K decode 21.1 vs 23.1 us with cluster, but the
// captured B1 step 34.3 vs 34.2 us: no gain there).
enum class DecodeSplit : int32_t { kAuto = 0, kBlocks = 1, kCluster = 2 };

// Warps per CTA of split-K decode (calls that split: small batches): 4 (each CTA cuts a 128-key
// block into two 64-key tiles, 16 keys of each per warp, and warp 0 merges the 4 warps' states) or
// 8 (query_major_wide.cuh: 8 warps share each block as one 128-key tile, 16 keys each, K and V in
// separate cp.async groups, all 8 warps merge the states in warp order and store their head dims of
// the partial; partials and combine unchanged; not bit-identical to 4: within the reference
// tolerances). 8 applies to per-token items of G <= 16 heads with K/V of the compute dtype on the
// shared-memory kernel, or fp8 K/V under kernel=auto (converted in registers by the 8 warps, in
// place of the 4-warp register kernel); not to kernel=regs / smem-forced fp8 / wgmma, MTP union
// items, NVFP4 K/V: there it falls back to 4 and the plan text says why. A forced 8
// also runs calls that do not split (fused: the 8 warps' merge writes the outputs); auto keeps 4
// there. With split=cluster the 8 warps run as clusters where they apply.
// docs/design/sparse_attention.md, "Decode split over 8 warps (split_warps=8)". auto: 8 where it
// applies for 16-bit K/V (H200 at 43c70d4 / fe6e5cc: B1 / 32K bf16 19.5 vs 23.8 us, B8 48.9 vs
// 50.3, B32 82.0 vs 87.0), for fp8 K/V where a split holds one block (H200 at a9d99bd: B1 / 32K
// 16.0 vs 18.7 us; at two blocks a split no gain), 4 elsewhere.
enum class DecodeSplitWarps : int32_t { kAuto = 0, k4 = 1, k8 = 2 };

// How split-K decode picks its split count (calls that split: fewer items than SMs): ceil (the
// resident CTAs' target over the items, ceil(ctas_per_sm * SMs / items), then rounded so that no
// split of a full list is empty) or waves (the count minimizing waves of resident CTAs times blocks
// per split: no partial second wave). auto: waves (H200 at 43dca7a, M3 / 32K paged: B32 bf16 49.1
// vs 57.7 us, fp8 35.6 vs 46.4 us; B1, B8 and B16 get the same counts either way).
// docs/design/sparse_attention.md, "Split heuristic".
enum class DecodeSplitRule : int32_t { kAuto = 0, kCeil = 1, kWaves = 2 };

// When split-K decode's combine loads a row's partial values (calls that split by blocks without
// split=cluster): after (once the row's LSEs gave the weights; a slot of weight 0 is not read) or
// with (the first 16 slots' values together with the LSEs: one memory round trip instead of two;
// the query-major kernels write every slot's values, zeros where a split saw no key). The same
// arithmetic: bit-identical. auto: with (H200 at dda49c5, Nsight Compute of the B1 / 128K
// decode's combine: 4.35 vs 4.70 us; the bench rows within their run-to-run spread, 5 of 7
// faster).
// docs/design/sparse_attention.md, "Combine".
enum class DecodeCombineLoads : int32_t { kAuto = 0, kAfter = 1, kWith = 2 };

// How the MTP wgmma kernel (kernel=wgmma, or auto where it takes it) feeds its K / V ring:
// inline (one producer warp plans each item (mtp_union_entries: the q2k lists, the page lookups,
// the union) between the last block of the item before and the first of this one, then loads
// each block after a page lookup of its own), ahead (a planner warp plans item i + 1, K / V
// coordinates included, while a loader warp streams item i's blocks; the loader reads no global
// memory and issues each block's K one block ahead of its V). Same MMAs and softmax order:
// bit-identical. auto: ahead (H200 at 42bbb91: B64 / 32K MTP sq 4 bf16 91.7 vs 98.7 us). Other
// kernels ignore it.
// docs/design/sparse_attention.md, "MTP union items on warpgroup MMAs".
enum class DecodeWgmmaPipe : int32_t { kAuto = 0, kInline = 1, kAhead = 2 };

// Whether the MTP wgmma kernel (kernel=wgmma, or auto where it takes it) runs fp8 e4m3 K/V: on
// (its loader warp copies each block's raw K or V by TMA into its ring stage, a warpgroup of 4
// converter warps converts it exactly into fp16 in place, and the consumers compute in fp16: fp16 q
// as the 16-bit kernel on the dequantized K and V, bit for bit; bf16 q scaled into fp16 by a power
// of two per item, as kernel=regs scales it per row; needs wgmma_pipe=ahead's warps, so
// wgmma_pipe=inline falls back), off. auto: on where kernel=wgmma is named, and where auto takes the
// wgmma kernel for more union items than half the SMs (H200 at 831d3e5, 32K / 4 tokens: never
// slower than auto's union register kernel from B34 to B128, B96 103.7 vs 151.4 us; at 455afa9,
// B28-B33 46.2-46.3 us against per-token items' 62.9-63.8); off below (per-token items on the
// register kernel). Other kernels and K/V dtypes ignore it.
// docs/design/sparse_attention.md, "fp8 K/V on the MTP wgmma kernel, in fp16".
enum class DecodeWgmmaFp8 : int32_t { kAuto = 0, kOff = 1, kOn = 2 };

// How the fp8 register kernel (kernel=regs with fp8 K/V on per-token 16-row items: 4 warps, each
// 32 keys of every 128-key block, 3 raw stages of 32 KB) fills its stages: cp_async (every thread
// copies 16-byte chunks of the next block's K and V, and each block step waits for its copies and
// for every warp at a CTA barrier) or tma (sm_90a: one thread loads a block's raw K and V as two
// TMA boxes of 128 keys x 128 bytes, announced on the stage's full barrier; each warp waits for the
// stage's full barrier and releases it on an empty barrier once its keys are done, so the warps
// meet no CTA barrier per block, and the loading thread refills a stage once all 4 warps released
// it). The raw layout is the same (TMA's 128-byte swizzle is the kernel's chunk swizzle), so the
// results are bit-identical; rows past a partial block's last visible key are zeroed by their warp
// instead of zero-filled by the copy. tma applies to per-token items that run the 16-row register
// kernel with fp8 K and V on a device with the library's sm_90a image, within TMA's coordinates
// (not split=cluster, not the 8-warp kernel); elsewhere it falls back to cp_async and the plan text
// says why. auto: cp_async (tma measured slower, H100: docs/design/sparse_attention.md#regs-feed-tma).
// docs/design/sparse_attention.md, "The fp8 register kernel fed by TMA".
enum class DecodeRegsFeed : int32_t { kAuto = 0, kCpAsync = 1, kTma = 2 };

struct SparseDecodeOptions {
  DecodeKernel kernel = DecodeKernel::kAuto;
  DecodeMtp mtp = DecodeMtp::kAuto;
  DecodeNvfp4Cvt nvfp4_cvt = DecodeNvfp4Cvt::kAuto;
  DecodeSplit split = DecodeSplit::kAuto;
  DecodeWgmmaPipe wgmma_pipe = DecodeWgmmaPipe::kAuto;
  DecodeWgmmaFp8 wgmma_fp8 = DecodeWgmmaFp8::kAuto;
  DecodeSplitWarps split_warps = DecodeSplitWarps::kAuto;
  DecodeSplitRule split_rule = DecodeSplitRule::kAuto;
  DecodeCombineLoads combine_loads = DecodeCombineLoads::kAuto;
  DecodeRegsFeed regs_feed = DecodeRegsFeed::kAuto;
};

struct SparseAttnOptions {
  PrefillSchedule schedule = PrefillSchedule::kAuto;
  KvMajorKernel kv_major_kernel = KvMajorKernel::kAuto;
  int64_t chunk_rows = 0;        // > 0: at most this many query rows per KV-major launch group
  int tile_max_waste_milli = 0;  // > 0: the shared-selection tiles' bound x 1000 (1000..8000)
  TileKernel tile_kernel = TileKernel::kAuto;
  KvMajorLists lists = KvMajorLists::kAuto;
  TileBound tile_bound = TileBound::kAuto;
  KvMajorStore kv_major_store = KvMajorStore::kAuto;
  KvMajorMath kv_major_math = KvMajorMath::kAuto;
};
// Requests from which the proxy decode kernel takes two key blocks per iteration for fp8 K (auto):
// measured better at 64 and worse at 1 (a1af6c4); 16 is between, not measured.
inline constexpr int kProxyDecodeIlpMinBatch = 16;
// The fp8 TMA decode kernel's query columns per pass (G heads x tokens, MMA N) where a request's
// rows fit them (decode_fp8, below).
inline constexpr int kProxyDecodeTmaCols = 8;
// What one pass of its 16-column build covers (two m16n8k16 MMAs per converted K fragment): taken
// where G x max_seqlen_q > kProxyDecodeTmaCols; auto takes the TMA kernel only up to this many
// columns (one pass).
inline constexpr int kProxyDecodeTmaMaxCols = 16;
struct ProxyScoreOptions {
  ProxyKernel kernel = ProxyKernel::kAuto;
  // decode_ctas=2|3|4: the CTAs per SM the decode kernel is built for with fp8 / NVFP4 K (more
  // CTAs: more warps per SM, fewer pipeline stages each); 0 = auto (fp8 3, NVFP4 4). A tuning knob.
  int decode_ctas = 0;
  // decode_ilp=1|2: key blocks per loop iteration of the decode kernel (every K dtype). 2: units
  // waited for in pairs, and a pair of loaded blocks of one single-pass request multiplied
  // together (two blocks' MMA chains per warp; the wait, barriers, shuffles and stores once per
  // pair); bit-identical to 1. 0 = auto: 2 for fp8 K at batch >= kProxyDecodeIlpMinBatch (H200,
  // B64/32K 84.4 vs 87.4 us at f4fdc62; B1 10.4 vs 8.9 us at a1af6c4), 1 otherwise
  // (docs/design/proxy_score.md, "Two key blocks per iteration").
  int decode_ilp = 0;
  // nvfp4_cvt=auto|byte|word: the decode kernel's NVFP4 K codes converted a byte (2 codes) or a
  // 32-bit word (8 codes) at a time (common/e2m1_word.cuh, as the sparse decode kernel's option of
  // that name); auto = word (H200 at 27436c2: B64 / 32K 103.5 vs 118.2 us, B1 10.3 vs 11.2 us).
  // Word sums a k-step's dims in another order than byte (last-bit differences; docs/design/
  // proxy_score.md, "NVFP4 a word at a time").
  DecodeNvfp4Cvt nvfp4_cvt = DecodeNvfp4Cvt::kAuto;
  // decode_fp8=auto|cta|tma: fp8 K on the decode kernel through the CTA-wide cp.async ring (cta) or
  // the TMA-fed warp-per-block kernel (tma: sm_90a, no reduce_heads; elsewhere cta runs); tma's
  // passes cover 8 columns (G x max_seqlen_q <= kProxyDecodeTmaCols) or else 16.
  // auto = tma at any batch with G x max_seqlen_q <= kProxyDecodeTmaMaxCols (one pass), else cta
  // (H200 at 054c9ce: B64 / 32K sq 1 74.5 vs 81.2 us; at 3cebf5e sq 4, one 16-column pass, 78.2 vs
  // 85.5 us; batch 1 since the page ids are read beside the lengths: 32K 8.2 vs 9.2 us, 128K 11.3
  // vs 14.5). The cta kernel's options (decode_ctas, decode_ilp) apply only where cta runs.
  DecodeTma decode_fp8 = DecodeTma::kAuto;
  // decode_nvfp4=auto|cta|tma: NVFP4 K (msa_proxy_score_fp4) on the decode kernel through the
  // CTA-wide cp.async ring (cta) or the TMA-fed warp-per-block kernel (tma: sm_90a, no
  // reduce_heads, a 16-byte aligned scale tensor; elsewhere cta runs), its passes as decode_fp8's.
  // tma sums each logit's dims in another order than cta (last-bit differences). auto = tma where
  // G x max_seqlen_q <= kProxyDecodeTmaMaxCols (one pass), at any batch, else cta (H200 at 900266d,
  // 32K: B64 sq 1 67.6 vs 104.1 us, sq 4 74.7 vs 104.7, B1 9.8 vs 10.8). The cta kernel's options
  // (decode_ctas, decode_ilp, nvfp4_cvt) apply only where cta runs.
  DecodeTma decode_nvfp4 = DecodeTma::kAuto;
  // decode_tma_issue=auto|producer|warps: the TMA kernel's loads by a producer warp or by each
  // consumer warp for itself (DecodeTmaIssue); calls not on the TMA kernel ignore it.
  DecodeTmaIssue decode_tma_issue = DecodeTmaIssue::kAuto;
};
// net_pivot: a warp per row (32 lanes), whose lanes' score minima give a pivot at or above the
// row's target-th best key; the keys at or below it (at most 32, else the networks run) are sorted
// by (key, block) across the warp (docs/design/topk_select.md, "Pivot before the networks"). For
// decode-sized calls, whose networks run once from a cold instruction cache. auto: on where it
// applies and net's lanes rule gives at least kTopkNetPivotMinLanes lanes a row (decode-sized
// calls; H200 at dda49c5: 1 x 4 x 1024 7.4 vs 9.3 us, 64 x 4 x 256 6.8 vs 7.9 us; the graphed
// decode step B1 / 128K 33.1 vs 36.1 us, B8 / 32K 47.2 vs 51.0 us), off elsewhere (prefill rows:
// a warp per row would read each block's scores of 32 rows as 32 separate lines).
enum class TopkNetPivot : int32_t { kAuto = 0, kOff = 1, kOn = 2 };
// net_pivot_mode: the pivot path's form (docs/design/topk_select.md, "Counting instead of
// sorting"). sort: a warp per row, three bitonic sorts across it (the lanes' minima for the pivot,
// the survivors by (key, block), the chosen blocks), 15 dependent shuffle stages each; rank_cta: a
// CTA of 4 warps per row, each a quarter of the row's scores (the lanes' minima meet in shared
// memory), the pivot and the cut as k-th smallest keys by counting, the survivors compacted in
// block order by ballots. Both choose the same blocks. auto: rank_cta for rows of more than 256
// blocks (16 or 32 scores a lane), sort for shorter ones (H200 at 0e3ed29 / 9903d0a, in the graphed
// fp8 steps: B1 / 128K top-k 3.26 vs 4.26 us, step 26.4 vs 28.4 us; B1 / 32K 3.23 vs 2.98 us, B64 /
// 32K 3.66 vs 3.68: the quarter of 8 scores saves less than the barriers cost; alone, L2 flushed:
// 1 x 4 x 1024 5.2-5.7 vs 7.2 us, 64 x 4 x 256 5.8 vs 6.9). The same counting in one warp a row,
// `rank`, was slower than sort (8.0 us at 1 x 4 x 1024) and is removed.
enum class TopkPivotMode : int32_t { kAuto = 0, kSort = 1, kRankCta = 2 };
// auto's rank_cta from this many pivot scores a lane (rows of more than 256 blocks).
inline constexpr int kTopkPivotCtaMinSlots = 16;
// The pivot path: a lane holds at most 32 scores, so rows of at most 32 x 32 blocks.
inline constexpr int kTopkNetPivotMaxSpan = 1024;
inline constexpr int kTopkNetPivotMinLanes = 16;

struct TopkSelectOptions {
  TopkKernel kernel = TopkKernel::kAuto;
  // net's lanes per row (a tuning knob; 0: auto, topk_net_lanes), a power of two <= 32.
  int net_lanes = 0;
  // net's pivot before the networks (a warp per row; rows of at most kTopkNetPivotMaxSpan
  // candidates choosing at most 15 of them); auto: decode-sized calls (TopkNetPivot).
  TopkNetPivot net_pivot = TopkNetPivot::kAuto;
  // The pivot path's order (TopkPivotMode); forced values need the pivot (not net_pivot=off).
  TopkPivotMode net_pivot_mode = TopkPivotMode::kAuto;
};

// Options of msa_sparse_attention: schedule=auto|query_major|kv_major|hybrid,
// kv_major_kernel=auto|mma_sync|wgmma|tma, chunk_rows=<n >= 1> (a testing knob: small inputs then run
// several launch groups), tile_max_waste=<x in [1, 8]> (a tuning knob; default with the TMA tiles 3.0 up to 8192 rows,
// else 2.0; 1.5 with cp.async),
// tile_kernel=auto|cp_async|tma, lists=auto|per_group|once, tile_bound=auto|fixed|adaptive (auto:
// adaptive with the TMA tiles' default bound from 8193 to 40960 rows, else fixed),
// kv_major_store=auto|stg|tma (auto: tma where G % 16 == 0 on the sm_90a kernel, else stg),
// kv_major_math=auto|precise|approx (auto: approx on the sm_90a kernel).
SparseAttnOptions parse_sparse_attention_options(std::string_view text);
// Options of msa_sparse_decode_attention: kernel=auto|smem|regs|wgmma, mtp=auto|per_token|union,
// nvfp4_cvt=auto|byte|word, split=auto|blocks|cluster, wgmma_pipe=auto|inline|ahead,
// wgmma_fp8=auto|off|on, split_warps=auto|4|8, split_rule=auto|ceil|waves,
// combine_loads=auto|after|with, regs_feed=auto|cp_async|tma.
SparseDecodeOptions parse_sparse_decode_options(std::string_view text);
// Options of msa_proxy_score / msa_proxy_score_fp4:
// kernel=auto|mma_sync|sm90|sm90_only|sm90_ss|sm90_ss_only|decode|decode_only|decode_f16|decode_f16_only|
// sm90_f16|sm90_f16_only,
// decode_ctas=auto|2|3|4, decode_ilp=auto|1|2, nvfp4_cvt=auto|byte|word, decode_fp8=auto|cta|tma,
// decode_nvfp4=auto|cta|tma, decode_tma_issue=auto|producer|warps.
ProxyScoreOptions parse_proxy_score_options(std::string_view text);
// Options of msa_topk_select:
// kernel=auto|warp_per_row|warp_per_row_8|radix|by_size|radix_1buf|warp_split|radix_uniform|
// warp_digits|net, net_lanes=auto|1|2|4|8|16|32 (net's lanes per row; a tuning knob).
TopkSelectOptions parse_topk_select_options(std::string_view text);

// ---- device facts ------------------------------------------------------------------------------

// Of one attention call's compute dtype and KV kind on the current device. CTAs per SM are 0 where
// the variant cannot run (no sm_90 GPU or no sm_90a image, not enough shared memory, no
// instantiation for the KV kind).
struct SparseAttnDeviceFacts {
  int num_sms = 0;
  int kv_major_wgmma_ctas = 0;
  int kv_major_tma_ctas = 0;               // kv_major_kernel=tma (16-bit K/V only)
  int kv_major_mma_sync_ctas[2] = {0, 0};  // with 1 and 2 query-tile stages
  int tile_ctas = 0;                       // shared-selection tile kernel (cp_async)
  int tile_tma_ctas = 0;                   // its TMA variant (16-bit K/V only)
  int decode_regs_ctas = 0;                // streaming decode variant (0: < 105 KB per CTA)
  int decode_cluster_max = 0;              // split=cluster: largest cluster (0: no clusters)
  int decode_wide_cluster_max = 0;         // ... of the 8-warp cluster kernel (one CTA per SM)
  int decode_mtp_wgmma_ctas = 0;           // kernel=wgmma's MTP union kernel (16-bit K/V only)
  int decode_regs_tma_ctas = 0;            // regs_feed=tma's register kernel (fp8 K/V, sm_90a)
};

// Of a top-k call on the current device (0: unknown; by_size then takes the radix kernel).
struct TopkSelectDeviceFacts {
  int num_sms = 0;
};

// ---- plans -------------------------------------------------------------------------------------

// Element type of split-K partial outputs.
enum class StoreKind : int { kF32 = 0, kBF16 = 1, kF16 = 2, kFP8 = 3 };
inline constexpr int store_kind_bytes(StoreKind k) {
  return k == StoreKind::kF32 ? 4 : (k == StoreKind::kFP8 ? 1 : 2);
}

// Bound of the KV-major lists=once work lists (counters, cursors, controls, items and list entries
// of every launch group; sized by kv_major_lists_once_bytes in sparse_attn/plan.cpp): the KV-major
// partial budget (1 GiB). Per group: 2 x Hkv x nb_bound counters / cursors, max_items items of 32
// bytes, Hkv x chunk_rows x topk list entries; the first two grow with the context, so the total
// grows about quadratically. M3 (4 kv heads, G 16, topk 16): 8K 2.2 MB (3 groups), 32K 9.0 MB
// (9 groups), 1M 619 MB (261 groups); 2M would take 1.9 GB and keeps per_group.
inline constexpr int64_t kKvMajorListsOnceBudget = int64_t(1) << 30;

// Every section of a workspace starts at a multiple of this many bytes.
inline constexpr size_t kWorkspaceAlign = 256;
inline constexpr int kMaxWorkspaceSections = 16;

// One named section of a plan's workspace; sections follow each other, each starting aligned.
struct WorkspaceSection {
  const char* name;
  size_t offset;
  size_t bytes;  // requested (the next section starts after it, rounded up to kWorkspaceAlign)
};

struct WorkspaceLayout {
  WorkspaceSection sections[kMaxWorkspaceSections];
  int num_sections = 0;
  size_t bytes = 0;  // total, a multiple of kWorkspaceAlign
  // Appends a section of n bytes and returns its offset.
  size_t take(const char* name, size_t n);
};

struct QueryMajorPlan {
  int warps_m = 0;    // 1 (G <= 16: one m16 tile per token) or 4 (64-row tiles)
  bool regs = false;  // decode: the streaming variant (DecodeKernel::kRegs where it applies)
  bool nvfp4_word = false;  // regs with NVFP4 K/V (16-row tiles): nvfp4_cvt=word's conversion
  // regs_feed=tma where it runs (fp8 K/V, 16-row tiles: stages filled by TMA); regs_tma_fallback: why
  // a regs_feed=tma call fills them by cp.async instead (static), nullptr otherwise.
  bool regs_tma = false;
  const char* regs_tma_fallback = nullptr;
  int mtp_tokens = 0; // decode: > 0 for MTP union items of this many tokens per request
  int row_tiles = 0;  // ceil(G / (16 * warps_m))
  int splits = 1;     // chunks of each row's used blocks
  bool fused = true;  // true: outputs written directly; false: partials + combine
  bool combine_with = false;  // the combine loads the first slots' values with the LSEs (decode)
  // split=cluster where it runs: the splits of a row as one cluster merging in shared memory (no
  // workspace, no combine); cluster_fallback: why a split=cluster call splits by blocks instead
  // (a static string for the plan text), nullptr otherwise.
  bool cluster = false;
  const char* cluster_fallback = nullptr;
  // split_warps=8 where it runs (8 warps per split CTA, query_major_wide.cuh); split_warps_fallback:
  // why a split_warps=8 call runs the 4-warp kernel instead (static), nullptr otherwise.
  bool wide = false;
  const char* split_warps_fallback = nullptr;
  // kernel=wgmma where it runs: MTP union items on the sm_90a TMA + wgmma kernel, a persistent grid
  // of `grid` CTAs; wgmma_fallback: why a kernel=wgmma call is planned as auto instead (static).
  bool wgmma = false;
  bool wgmma_ahead = false;  // wgmma with wgmma_pipe=ahead (planner and loader warps)
  bool wgmma_fp8 = false;    // wgmma with fp8 K/V (wgmma_fp8=on: raw copies, converter warps)
  int grid = 0;
  const char* wgmma_fallback = nullptr;
  StoreKind part_kind = StoreKind::kBF16;
  int64_t num_items = 0;
  size_t part_o_off = 0, part_lse_off = 0, part_lse_t_off = 0;
};

struct KvMajorPlan {
  KvMajorKernel kernel = KvMajorKernel::kMmaSync;  // resolved: kMmaSync, kWgmma or kTma
  const char* tma_fallback = nullptr;  // kv_major_kernel=tma that took another kernel: why (static)
  // The partials by TMA stores (kv_major_store auto or tma) on the kWgmma kernel (G % 16 == 0,
  // partial rows within TMA's coordinates); store_fallback: why they did not apply (static),
  // nullptr where they did or where stg was asked for.
  bool tma_store = false;
  const char* store_fallback = nullptr;
  // The MUFU row math (kv_major_math auto or approx) on the kWgmma kernel; math_fallback: why a
  // forced approx did not apply.
  bool approx_math = false;
  const char* math_fallback = nullptr;
  int q_stages = 0;
  int chunk_rows = 0;  // rows of a launch group (equal groups, the last one may be shorter)
  int groups = 0;      // launch groups: ceil(total_q / chunk_rows)
  int nb_bound = 0;
  int tokens_per_item = 0;
  int max_items = 0;
  int grid = 0;     // persistent attention CTAs
  int num_sms = 0;  // of the device planned for (the list-building prologue's grid: 2 per SM)
  // Work lists: per_group, or once (then counts / cursors [groups, Hkv, nb_bound], control
  // [groups], items [groups, max_items], list [groups, Hkv, chunk_rows, topk]: group j's part of
  // each at j times its per-group size); resolved from the option (auto: once where it fits).
  // lists_fallback: once (asked for or auto) exceeded kKvMajorListsOnceBudget (lists_once_bytes,
  // the size it would have taken).
  KvMajorLists lists = KvMajorLists::kPerGroup;
  bool lists_fallback = false;
  int64_t lists_once_bytes = 0;
  size_t block_base_off = 0, counts_off = 0, cursors_off = 0, control_off = 0, items_off = 0,
         list_off = 0, part_o_off = 0, part_lse_off = 0, part_lse_t_off = 0;
  // Shared-selection tiles (sm_90a, bf16 / fp16 / fp8 K and V, G in {16, 32, 64, 128}), computed
  // before the KV-major groups, which skip the rows of qualifying tiles.
  bool tiles = false;
  int tile_tokens = 0;
  int num_tiles = 0;
  int tile_max_entries = 0;
  int tile_max_waste_milli = 0;
  int tile_wide_waste_milli = 0;  // > 0 (tile_bound=adaptive): the wider bound, taken on the device
  int tile_grid = 0;
  TileKernel tile_kernel = TileKernel::kCpAsync;  // resolved: kCpAsync or kTma
  const char* tile_fallback = nullptr;  // tile_kernel=auto / tma that took cp_async: why (static)
  size_t tile_done_off = 0, tile_count_off = 0, tile_block_off = 0, tile_mask_off = 0,
         tile_work_off = 0, tile_control_off = 0;
};

// Plan of msa_sparse_attention and msa_sparse_decode_attention (decode is always query-major).
struct SparseAttnPlan {
  PrefillSchedule schedule = PrefillSchedule::kQueryMajor;  // resolved: never kAuto
  QueryMajorPlan qm;                                        // schedule == kQueryMajor
  KvMajorPlan kvm;  // kKvMajor, or kHybrid (kvm.tiles: the tiles run first)
  WorkspaceLayout workspace;
  size_t bytes = 0;  // device scratch of the call (workspace.bytes)
};

struct ProxyScorePlan {
  ProxyKernel kernel = ProxyKernel::kMmaSync;  // resolved: kMmaSync, kSm90, kSm90Ss or kDecode
  bool strict = false;  // the named kernel or NotImplementedError (no fallback to mma_sync)
  // The decode kernel with fp8 K: fp16 MMAs whatever q's dtype (one cvt per e4m3 pair instead of
  // the e4m3 -> fp16 -> fp32 -> bf16 chain; bf16 q rows scaled into fp16 by a power of two, fp8 q
  // exact in fp16). Set by decode_f16 / decode_f16_only, and by auto for fp8 K on the decode kernel
  // (H200 at 1aad2ee: bit-identical, B64/32K 105 vs 125 us; docs/design/proxy_score.md). On the
  // sm_90a kernel (sm90_f16 / sm90_f16_only, and auto for fp8 K since the H200 run at b66f97b:
  // bit-identical, 32K prefill 874.8 vs 1067.6 us): the same for fp8 K with bf16 q, Q in registers,
  // and NVFP4 q and K as value x 2^-7 (auto's since the H200 run at 5cb9800: 1352.0 vs 1805.0 us).
  bool f16_mma = false;
  // fp8 q (with fp8 K) on the sm_90a kernel's fp16 MMAs (KFormat::kFp8Q: Q's raw bytes by TMA, its
  // fragments converted exactly in registers). Set by sm90_f16 / sm90_f16_only, and by auto for fp8
  // q and K on the sm_90a kernel since the H200 run at 831d3e5 (32K prefill 854.3 vs 1736.5 us on
  // mma.sync); sm90 / sm90_ss keep fp8 q on mma.sync.
  bool fp8_q = false;
  // The decode kernel's CTAs per SM (2, 3 or 4): fp8 / NVFP4 K the option decode_ctas or auto's
  // 3 / 4 (H200 at b1fafdd), 16-bit K 2.
  int decode_ctas = 2;
  // The decode kernel's key blocks per loop iteration (1 or 2): the option decode_ilp (auto: 2 for fp8 K).
  int decode_ilp = 1;
  // The decode kernel with NVFP4 K converts its codes a word at a time (the option nvfp4_cvt=word).
  bool nvfp4_word = false;
  // The decode kernel with fp8 or NVFP4 K takes the TMA-fed warp-per-block kernel where it applies
  // (the options decode_fp8=tma / decode_nvfp4=tma; the launcher falls back to the cp.async ring
  // elsewhere).
  bool tma = false;
  // tma is decode_nvfp4's (NVFP4 K), not decode_fp8's.
  bool tma_nvfp4 = false;
  // The TMA kernel's consumer warps issue their own loads (decode_tma_issue=warps); false without tma.
  bool tma_self_issue = false;
  // Its query columns per pass (G heads x tokens): kProxyDecodeTmaCols (8) where G x max_seqlen_q
  // fits them, else kProxyDecodeTmaMaxCols (16); 8 without tma.
  int tma_cols = kProxyDecodeTmaCols;
};
struct TopkSelectPlan {
  TopkKernel kernel = TopkKernel::kWarpPerRow;  // resolved: any but kAuto and kBySize
  // kernel == kNet: lanes per row (1, 2, 4, ..., 32) and words per lane (16 or 32).
  int net_lanes = 0;
  int net_words = 0;
  // kernel == kNet with the pivot (net_lanes 32): scores a lane holds (8, 16 or 32), else 0.
  int net_pivot = 0;
  // With the pivot: its form (kSort: a warp a row; kRankCta: a CTA of 4 warps a row, each holding
  // net_pivot / 4 scores a lane).
  TopkPivotMode net_pivot_mode = TopkPivotMode::kSort;
  // Why a forced kernel=net runs another kernel (a static string for the plan text), or nullptr.
  const char* net_fallback = nullptr;
  // Why net_pivot=on does not apply to the call, or nullptr.
  const char* net_pivot_fallback = nullptr;
};

// ---- planners (pure) ---------------------------------------------------------------------------
// Each throws a ValueError for inconsistent options and a NotImplementedError (kNotSupported) for a
// forced option this device cannot run.

SparseAttnPlan plan_sparse_attention(const SparseAttnParams& p, const SparseAttnOptions& options,
                                     const SparseAttnDeviceFacts& facts);
// Why tile_kernel=tma falls back to the cp_async tile kernel for these params and facts (a static
// string, kept in KvMajorPlan::tile_fallback for the plan text), or nullptr where it runs.
const char* tile_tma_unsupported(const SparseAttnParams& p, const SparseAttnDeviceFacts& facts);
// Why kv_major_kernel=tma falls back for these params and facts (a static string, kept in
// KvMajorPlan::tma_fallback for the plan text), or nullptr where it runs; chunk_rows: the rows of
// a launch group (the partial rows must fit TMA's 32-bit coordinates).
const char* kv_major_tma_unsupported(const SparseAttnParams& p, const SparseAttnDeviceFacts& facts,
                                     int64_t chunk_rows);
SparseAttnPlan plan_sparse_decode(const SparseDecodeParams& p, const SparseAttnDeviceFacts& facts,
                                  const SparseDecodeOptions& options = {});
// Why kernel=wgmma's MTP union kernel does not run these params with these facts (a static string,
// kept in QueryMajorPlan::wgmma_fallback for the plan text), or nullptr where it runs. mtp: whether
// the call has MTP union items; options: kernel, wgmma_fp8 and wgmma_pipe (fp8 K/V run with
// wgmma_fp8=on, or auto where kernel=wgmma is named or the union items outnumber half the SMs, and
// only on the ahead pipe).
const char* mtp_wgmma_unsupported(const SparseAttnParams& p, bool mtp, const SparseAttnDeviceFacts& facts,
                                  const SparseDecodeOptions& options = {});
ProxyScorePlan plan_proxy_score(const ProxyScoreParams& p, const ProxyScoreOptions& options);
// Whether the proxy decode kernel runs a call: at most 16 query heads per KV head (the G heads of
// a token fill one 16-row MMA pass), reduce_heads only with one KV head, NVFP4 q and k together.
bool proxy_decode_runs(const ProxyScoreParams& p);
// Whether auto takes it: proxy_decode_runs and G x max_seqlen_q <= kProxyDecodeAutoMaxRows.
bool proxy_auto_takes_decode(const ProxyScoreParams& p);
TopkSelectPlan plan_topk_select(const TopkSelectParams& p, const TopkSelectOptions& options,
                                const TopkSelectDeviceFacts& facts = {});

// Why kernel=net cannot run these params (a static string), or nullptr where it runs.
const char* topk_net_unsupported(const TopkSelectParams& p);
// net's lanes per row for these params on a GPU of num_sms SMs (0: unknown, one lane per row).
int topk_net_lanes(const TopkSelectParams& p, int num_sms);
// Why the pivot path cannot run the call (nullptr: it can): the scores a lane holds (rows of at
// most kTopkNetPivotMaxSpan blocks) and the words (rows choosing at most 15).
const char* topk_net_pivot_unsupported(const TopkSelectParams& p);

// Option names (for messages and tests).
const char* option_name(PrefillSchedule v);
const char* option_name(KvMajorKernel v);
const char* option_name(KvMajorStore v);
const char* option_name(KvMajorMath v);
const char* option_name(TileKernel v);
const char* option_name(TileBound v);
const char* option_name(KvMajorLists v);
const char* option_name(ProxyKernel v);
const char* option_name(TopkKernel v);
const char* option_name(TopkPivotMode v);
const char* option_name(DecodeKernel v);
const char* option_name(DecodeMtp v);
const char* option_name(DecodeNvfp4Cvt v);
const char* option_name(DecodeTma v);
const char* option_name(DecodeTmaIssue v);
const char* option_name(DecodeSplit v);
const char* option_name(DecodeWgmmaPipe v);
const char* option_name(DecodeWgmmaFp8 v);
const char* option_name(DecodeSplitWarps v);
const char* option_name(DecodeSplitRule v);
const char* option_name(DecodeCombineLoads v);
const char* option_name(DecodeRegsFeed v);

}  // namespace flashmsa
