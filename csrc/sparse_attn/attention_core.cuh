// The device core shared by the query-major and KV-major kernels:
//   * KV tile loading: cp.async of 16-byte chunks with zero-fill of rows past the valid keys, either
//     straight into a compute tile (K/V already in the compute dtype) or as raw fp8 / NVFP4 bytes
//     that convert_kv_rows dequantizes into a compute tile (exact: every e4m3 and e2m1 * e4m3 value
//     is a bf16 and an fp16 value);
//   * the warp-level attention step on mma.sync m16n8k16: S = Q K^T, masking by a per-row key limit,
//     online softmax in base 2 with the safe-max trick, P rounded to the compute dtype, O += P V;
//   * the epilogue store of a 16 x 128 accumulator tile through a swizzled per-warp staging buffer.
// Compute tiles are [rows][128] 16-bit elements, 256 bytes per row, chunk-swizzled
// (swizzle_128x16b_bytes).
#pragma once

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "flashmsa/semantics.h"
#include "sparse_attn/kernel_traits.h"
#include "common/ptx.cuh"

namespace flashmsa::sparse_attn {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

MSA_DEVICE float neg_inf() { return -INFINITY; }

// The ldm_base_* / store_rows addressing XORs the swizzle into addresses, which is only right for
// tiles at 256-byte (staging: 512-byte) aligned shared addresses; the kernels align everything to
// the dynamic shared memory base, declared __align__(1024). Trap loudly should a toolchain ever
// place it otherwise, instead of computing with misplaced fragments.
MSA_DEVICE void check_smem_base(const void* base) {
  if (threadIdx.x == 0 && (smem_addr(base) & 1023u) != 0) __trap();
}

// Sequence owning query row r, or -1 when no sequence covers it (its outputs are 0 / -inf).
MSA_DEVICE int find_sequence(const SparseAttnParams& p, int r) {
  if (p.qi.cu_seqlens_q == nullptr) {
    if (p.qi.seqlen_q <= 0) return -1;
    const int b = r / p.qi.seqlen_q;
    if (b >= p.batch) return -1;
    const RowRange rr = q_rows(p.qi, p.total_q, b);
    return (r >= rr.begin && r < rr.begin + rr.len) ? b : -1;
  }
  // The last sequence whose first row is <= r (empty sequences before it share its begin).
  int lo = 0, hi = p.batch - 1, found = -1;
  while (lo <= hi) {
    const int mid = (lo + hi) >> 1;
    if (q_rows(p.qi, p.total_q, mid).begin <= r) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  if (found < 0) return -1;
  const RowRange rr = q_rows(p.qi, p.total_q, found);
  return r < rr.begin + rr.len ? found : -1;
}

// The row's q2k entries, one per lane (entries lane and lane + 32; -1 past topk), with the list
// length and, per lane, whether each of its entries is used (semantics.h q2k_length and
// q2k_entry_used, computed with shuffles instead of each lane re-reading the earlier entries).
struct WarpQ2k {
  int v[2];
  bool used[2];
  int len;
};

MSA_DEVICE WarpQ2k warp_q2k_list(const int* list, int topk, int nb, int lane) {
  WarpQ2k wl;
  wl.v[0] = lane < topk ? list[lane] : -1;
  wl.v[1] = lane + 32 < topk ? list[lane + 32] : -1;
  const uint32_t neg0 = __ballot_sync(0xffffffffu, lane < topk && wl.v[0] < 0);
  const uint32_t neg1 = __ballot_sync(0xffffffffu, lane + 32 < topk && wl.v[1] < 0);
  wl.len = neg0 ? __ffs(neg0) - 1 : (neg1 ? 32 + __ffs(neg1) - 1 : topk);
  bool dup[2] = {false, false};
  for (int j = 0; j < min(topk, 64); ++j) {  // uniform trip count: every lane shuffles
    const int x = __shfl_sync(0xffffffffu, j < 32 ? wl.v[0] : wl.v[1], j & 31);
#pragma unroll
    for (int k = 0; k < 2; ++k) dup[k] |= j < lane + 32 * k && x == wl.v[k];
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) wl.used[k] = lane + 32 * k < wl.len && wl.v[k] < nb && !dup[k];
  return wl;
}

// Where one K or V tile lives: element offset (bytes for NVFP4) of its first key, how many keys
// are real (the rest are zero-filled), and the NVFP4 scale row of its first key.
struct TileDesc {
  int64_t k_off;
  int64_t v_off;
  int64_t scale_row;
  int n_valid;
  int pad;
};

// Scale rows of consecutive keys of one block: (token, head)-ordered flat caches step by Hkv,
// (page, head, token)-ordered paged caches by 1 (semantics.h kv_scale_row).
MSA_DEVICE int scale_row_step(const SparseAttnParams& p) {
  return !p.kv.paged ? p.num_kv_heads : 1;
}

// Bytes of one raw (not yet dequantized) row and of its NVFP4 scales.
template <KvKind kKv>
inline constexpr int kRawRowBytes = kKv == KvKind::kFp8 ? 128 : (kKv == KvKind::kNvfp4 ? 64 : 256);
template <KvKind kKv>
inline constexpr int kRawScaleBytes = kKv == KvKind::kNvfp4 ? 8 : 0;

// Raw bytes of a kRows-key K (or V) tile: data then (NVFP4) scales.
template <KvKind kKv, int kRows>
inline constexpr int kRawTileBytes = kRows * (kRawRowBytes<kKv> + kRawScaleBytes<kKv>);

// Compute-tile layouts the loaders can write: RowTile is the [rows][128] row-swizzled tile of the
// mma.sync kernels (swizzle_128x16b_bytes); Sw128Tile<kRows> the [2][kRows][64] 128-byte-swizzled
// tile that wgmma reads (common/wgmma.cuh).
struct RowTile {
  static MSA_DEVICE uint32_t at(int row, int ch) { return swizzle_128x16b_bytes(row, ch); }
};
template <int kRows>
struct Sw128Tile {
  static MSA_DEVICE uint32_t at(int row, int ch) {
    return uint32_t(ch >> 3) * uint32_t(kRows * 128) + uint32_t(row) * 128u +
           (uint32_t((ch & 7) ^ (row & 7)) << 4);
  }
};

// Issues the cp.async copies of keys [0, kRows) of one K or V tile starting at element offset
// `off` of `t`; keys >= n_valid are zero-filled. Native: straight into the compute tile at `dst`.
// fp8 / NVFP4: raw rows into `dst` ([kRows][raw row bytes], then [kRows][8] scale bytes).
template <typename Elem, KvKind kKv, int kRows, int kThreads, class Tile = RowTile>
MSA_DEVICE void issue_kv_rows(const KVTensor& t, int64_t off, int64_t scale_row0, int scale_step,
                              int n_valid, uint32_t dst, int tid) {
  const uint8_t* base = static_cast<const uint8_t*>(t.data);
  if constexpr (kKv == KvKind::kNative) {
    const Elem* src0 = static_cast<const Elem*>(t.data) + off;
    static_assert((kRows * 16) % kThreads == 0, "whole chunks per thread");
    // At most 16 copies in flight per unrolled step: a single producer warp issues 64 per tile,
    // and fully unrolled their 64 source pointers would all be live at once.
#pragma unroll 16
    for (int i = 0; i < kRows * 16 / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int row = c >> 4, ch = c & 15;
      const bool ok = row < n_valid;
      const Elem* src = ok ? src0 + int64_t(row) * t.stride_token + ch * 8 : src0;
      cp_async_16_zfill(dst + Tile::at(row, ch), ok ? static_cast<const void*>(src) : base, ok);
    }
  } else {
    constexpr int kChunksPerRow = kRawRowBytes<kKv> / 16;
    static_assert((kRows * kChunksPerRow) % kThreads == 0, "whole chunks per thread");
    const uint8_t* src0 = base + off;
#pragma unroll
    for (int i = 0; i < kRows * kChunksPerRow / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int row = c / kChunksPerRow, ch = c % kChunksPerRow;
      const bool ok = row < n_valid;
      const uint8_t* src = ok ? src0 + int64_t(row) * t.stride_token + ch * 16 : base;
      cp_async_16_zfill(dst + uint32_t(row * kRawRowBytes<kKv> + ch * 16), src, ok);
    }
    if constexpr (kKv == KvKind::kNvfp4) {
      // Scale columns 0..3 and 4..7 of a row are two 4-byte runs 512 bytes apart (128x4 layout).
      const uint32_t dst_scale = dst + uint32_t(kRows * kRawRowBytes<kKv>);
      for (int c = tid; c < kRows * 2; c += kThreads) {
        const int row = c >> 1, half = c & 1;
        const bool ok = row < n_valid;
        const uint8_t* src =
            ok ? t.scale + nvfp4_scale_offset(scale_row0 + int64_t(row) * scale_step, 4 * half)
               : t.scale;
        cp_async_4_zfill(dst_scale + uint32_t(row * 8 + half * 4), src, ok);
      }
    }
  }
}

// Dequantizes a raw fp8 / NVFP4 tile (issue_kv_rows layout) into the compute tile at `tile`.
template <typename Elem, KvKind kKv, int kRows, int kThreads, class Tile = RowTile>
MSA_DEVICE void convert_kv_rows(const uint8_t* raw, uint8_t* tile, int tid) {
  if constexpr (kKv == KvKind::kFp8) {
    // 16 fp8 values (one raw chunk) -> two compute chunks.
    static_assert((kRows * 8) % kThreads == 0, "whole chunks per thread");
#pragma unroll
    for (int i = 0; i < kRows * 8 / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int row = c >> 3, ch = c & 7;
      const uint4 in = *reinterpret_cast<const uint4*>(raw + row * 128 + ch * 16);
      uint4 lo, hi;
      e4m3x16_to<Elem>(in, lo, hi);
      *reinterpret_cast<uint4*>(tile + Tile::at(row, 2 * ch)) = lo;
      *reinterpret_cast<uint4*>(tile + Tile::at(row, 2 * ch + 1)) = hi;
    }
  } else if constexpr (kKv == KvKind::kNvfp4) {
    // 32 e2m1 values (one raw chunk, two scale groups of 16) -> four compute chunks.
    static_assert((kRows * 4) % kThreads == 0, "whole chunks per thread");
    const uint8_t* raw_scale = raw + kRows * 64;
#pragma unroll
    for (int i = 0; i < kRows * 4 / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int row = c >> 2, ch = c & 3;
      const uint4 in = *reinterpret_cast<const uint4*>(raw + row * 64 + ch * 16);
      const uint32_t w[4] = {in.x, in.y, in.z, in.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        // Output chunk 4ch+q holds elements 32ch+8q .. +7 = the 4 bytes of w[q]; scale group 2ch+q/2.
        const float scale = e4m3_to_float(raw_scale[row * 8 + 2 * ch + (q >> 1)]) * 16384.0f;
        uint32_t out[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) out[j] = e2m1x2_to<Elem>((w[q] >> (8 * j)) & 0xFFu, scale);
        *reinterpret_cast<uint4*>(tile + Tile::at(row, 4 * ch + q)) =
            make_uint4(out[0], out[1], out[2], out[3]);
      }
    }
  }
}

// ---- warp-level attention step -----------------------------------------------------------------
// A warp owns kMT m16 tiles of query rows and processes a step of kNT * 8 keys of the K / V tiles.
//
// ldmatrix addressing: every row a lane addresses has row % 8 == lane % 8 and its 16-byte chunk is
// 2c + (0 or 1) for a per-instruction even offset 2c, so with 256-byte aligned tiles the swizzled
// address of step c is the lane's base address XOR (c << 5): one base register per operand and an
// immediate per step, instead of a recomputed swizzle per ldmatrix.

// A operand (rows row0 .. row0 + 15 of a [rows][128] tile): lanes 0-15 address rows 0-15 at
// chunk 2c, lanes 16-31 the same rows at chunk 2c + 1.
MSA_DEVICE uint32_t ldm_base_a(uint32_t tile, int row0, int lane) {
  return tile + uint32_t(row0 + (lane & 15)) * 256u + uint32_t(((lane >> 4) ^ (lane & 7)) << 4);
}
// B operand from K (keys key0 .. + 15, two n8 tiles): lanes 0-7 keys 0-7 chunk 2c, 8-15 keys 0-7
// chunk 2c + 1, 16-23 keys 8-15 chunk 2c, 24-31 keys 8-15 chunk 2c + 1.
MSA_DEVICE uint32_t ldm_base_k(uint32_t tile, int key0, int lane) {
  return tile + uint32_t(key0 + (lane & 7) + ((lane >> 4) << 3)) * 256u +
         uint32_t((((lane >> 3) & 1) ^ (lane & 7)) << 4);
}
// B operand from V, transposed (keys key0 .. + 15 = k, dims = n): lanes 0-7 keys 0-7 chunk 2c,
// 8-15 keys 8-15 chunk 2c, 16-23 keys 0-7 chunk 2c + 1, 24-31 keys 8-15 chunk 2c + 1.
MSA_DEVICE uint32_t ldm_base_v(uint32_t tile, int key0, int lane) {
  return tile + uint32_t(key0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * 256u +
         uint32_t(((lane >> 4) ^ (lane & 7)) << 4);
}

// s[mt][nt] = Q[rows 16 mt ..] . K[keys 8 nt ..]^T over the 128 head dims; q_base = ldm_base_a of
// the warp's first row, k_base = ldm_base_k of the step's first key.
template <typename Elem, int kMT, int kNT>
MSA_DEVICE void gemm_qk(float (&s)[kMT][kNT][4], uint32_t q_base, uint32_t k_base) {
  static_assert(kNT % 2 == 0, "keys come in pairs of n8 tiles (one ldmatrix.x4)");
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) ldmatrix_x4(a[mt], (q_base + mt * 16 * 256) ^ (kk << 5));
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, (k_base + np * 16 * 256) ^ (kk << 5));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma_m16n8k16<Elem>(s[mt][2 * np], a[mt], b[0], b[1]);
        mma_m16n8k16<Elem>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// o[mt] += P[mt] . V[keys of the step], P taken from s (already exponentiated) and rounded to the
// compute dtype, as the MMA needs; v_base = ldm_base_v of the step's first key.
template <typename Elem, int kMT, int kNT>
MSA_DEVICE void gemm_pv(float (&o)[kMT][16][4], const float (&s)[kMT][kNT][4], uint32_t v_base) {
#pragma unroll
  for (int ks = 0; ks < kNT / 2; ++ks) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      a[mt][0] = pack2<Elem>(s[mt][2 * ks][0], s[mt][2 * ks][1]);
      a[mt][1] = pack2<Elem>(s[mt][2 * ks][2], s[mt][2 * ks][3]);
      a[mt][2] = pack2<Elem>(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
      a[mt][3] = pack2<Elem>(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < 8; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, (v_base + ks * 16 * 256) ^ (dp << 5));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma_m16n8k16<Elem>(o[mt][2 * dp], a[mt], b[0], b[1]);
        mma_m16n8k16<Elem>(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Scale of a partial state (m_w, l_w) when merged into one whose max is m (both base 2).
MSA_DEVICE float merge_factor(float m_w, float m_use) {
  return m_w == neg_inf() ? 0.0f : exp2_approx(m_w - m_use);
}

// The same for temperature sums, which are relative to T * m.
MSA_DEVICE float merge_factor_t(float m_w, float m_use, float temp) {
  return m_w == neg_inf() ? 0.0f : exp2_approx(temp * (m_w - m_use));
}

// Running softmax state of the fragment rows a thread holds: [mt][h], h = 0 for row gid, 1 for
// gid + 8. m is the running max of the base-2 scaled logits x = S * scale * log2(e) (-inf while no
// key was visible); l and lt are this thread's partial sums of 2^(x - m) and 2^(T (x - m)), reduced
// over the 4 threads of a row only at the end (quad_reduce).
template <int kMT>
struct SoftmaxState {
  float m[kMT][2];
  float l[kMT][2];
  float lt[kMT][2];

  MSA_DEVICE void init() {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m[mt][h] = neg_inf();
        l[mt][h] = 0.0f;
        lt[mt][h] = 0.0f;
      }
  }

  MSA_DEVICE void quad_reduce() {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 1);
        l[mt][h] += __shfl_xor_sync(0xffffffffu, l[mt][h], 2);
        lt[mt][h] += __shfl_xor_sync(0xffffffffu, lt[mt][h], 1);
        lt[mt][h] += __shfl_xor_sync(0xffffffffu, lt[mt][h], 2);
      }
  }
};

// Masks keys >= lim[mt][h] (relative to the step's first key), updates the running state, rescales
// o, and leaves P = 2^(x - m) in s. The safe max (0 while a row has seen no visible key) keeps
// fully masked rows at exactly 0 without NaN: 2^(-inf - 0) = 0.
//
// Lazy rescaling: a row's reference max m moves only when the step's max exceeds it by more than
// `slack` (base-2 units), so P <= 2^slack and l, o are sums of terms <= 2^slack: exact up to
// rounding for slack <= 8 (P rounds to the compute dtype with the same relative error, l stays
// far from overflow). The 128 o-rescaling multiplies per thread, the largest non-MMA cost of a
// step, are skipped for the whole warp when no row moved. The rule is per row, so a row's result
// never depends on the other rows of its tile (D11); with slack 0 it is the eager rule (m = the
// running max) and bit-identical to it (an unmoved row's factor is exactly 1).
// kMask = false: the caller knows every key of the step is visible to every row (lim >= kNT * 8),
// and the per-key compares are left out (the same values as with the mask).
// o: kON n8 tiles of output per m tile (16: the 128 head dims; 4: a quarter of them).
// row_max: called with the step's row maxima (after the quad reduction) before they are used; the
// MTP union register kernel (query_major.cuh) takes the maximum over the warps that hold the other
// keys of the same rows there. The default leaves them.
struct NoRowMax {
  template <int kMT>
  MSA_DEVICE void operator()(float (&)[kMT][2]) const {}
};
template <int kMT, int kNT, bool kMask = true, int kON = 16, typename RowMax = NoRowMax>
MSA_DEVICE void softmax_step(float (&s)[kMT][kNT][4], float (&o)[kMT][kON][4], SoftmaxState<kMT>& st,
                             const int (&lim)[kMT][2], float scale_log2, bool has_temp, float temp,
                             int lane, float slack = 0.0f, const RowMax& row_max = RowMax{}) {
  const int tig = lane & 3;
  constexpr bool kHook = !std::is_same_v<RowMax, NoRowMax>;
  float alpha[kMT][2], m_use[kMT][2], m_prev[kMT][2], mx[kMT][2];
  bool moved[kMT][2];
  bool any_moved = false;
  // The running max of row (mt, h) from the step's max (right after it without a hook, which keeps
  // the kernels without one exactly as they were compiled before it existed).
  auto update = [&](int mt, int h, const float (&step_max)[kMT][2]) {
    // -inf + slack = -inf: the first visible key always moves the row; NaN never does.
    const float m_old = st.m[mt][h];
    m_prev[mt][h] = m_old;
    moved[mt][h] = step_max[mt][h] > m_old + slack;
    const float m_new = moved[mt][h] ? step_max[mt][h] : m_old;
    m_use[mt][h] = m_new == neg_inf() ? 0.0f : m_new;
    alpha[mt][h] = moved[mt][h] ? exp2_approx(m_old - m_use[mt][h]) : 1.0f;
    st.m[mt][h] = m_new;
    any_moved |= moved[mt][h];
  };
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[mt][h] = neg_inf();
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = nt * 8 + 2 * tig + e;
          const float x = !kMask || key < lim[mt][h] ? s[mt][nt][2 * h + e] * scale_log2 : neg_inf();
          s[mt][nt][2 * h + e] = x;
          mx[mt][h] = fmaxf(mx[mt][h], x);
        }
      mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], 1));
      mx[mt][h] = fmaxf(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], 2));
      if constexpr (!kHook) update(mt, h, mx);
    }
  }
  if constexpr (kHook) {
    row_max(mx);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) update(mt, h, mx);
  }
  if (__any_sync(0xffffffffu, any_moved)) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int d = 0; d < kON; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][d][e] *= alpha[mt][e >> 1];
  }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = 0.0f, sum_t = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = s[mt][nt][2 * h + e];
          if (has_temp) sum_t += x == neg_inf() ? 0.0f : exp2_approx(temp * (x - m_use[mt][h]));
          const float pr = exp2_approx(x - m_use[mt][h]);
          s[mt][nt][2 * h + e] = pr;
          sum += pr;
        }
      st.l[mt][h] = st.l[mt][h] * alpha[mt][h] + sum;
      if (has_temp) {
        // An unmoved row keeps its temperature sum (factor 1: its old max is m_use, or it has seen
        // nothing and the sum is 0).
        const float f_t = moved[mt][h] ? merge_factor_t(m_prev[mt][h], m_use[mt][h], temp) : 1.0f;
        st.lt[mt][h] = st.lt[mt][h] * f_t + sum_t;
      }
    }
  }
}

// log2-domain LSE of a finished row: m + log2(l), -inf when nothing was visible. approx: log2 by
// MUFU.LG2 (lg2.approx, ~2^-22 absolute for l >= 1; the sm_90a KV-major kernel's kv_major_math=
// approx) instead of log2f.
MSA_DEVICE float row_lse2(float m, float l, bool approx = false) {
  return l > 0.0f ? m + (approx ? log2_approx(l) : log2f(l)) : neg_inf();
}
MSA_DEVICE float row_lse2_t(float m, float lt, float temp, bool approx = false) {
  return lt > 0.0f ? temp * m + (approx ? log2_approx(lt) : log2f(lt)) : neg_inf();
}

// ---- epilogue store ----------------------------------------------------------------------------

// A split's partial row (O / l: a convex combination of V rows, in V's units, before the V scale)
// can come out a rounding past V's largest magnitude, since P is rounded to the compute dtype for
// P V while l sums it unrounded (the reference's arithmetic too): with V near the top of fp16 that
// is past fp16's largest finite value, and an inf partial makes the merged output inf where the
// reference, scaled after the merge, is finite (the H200 fuzzer, attention:517681 / 553091: fp16
// V near 65504, V scale 0.001 / 0.37). fp16 partials are therefore saturated there; inf and NaN
// stay (fp8 partials saturate in their conversion already). bf16 partials are not: the same
// needs V within a rounding of 3.4e38, and the four instructions a value cost the KV-major kernels
// 4-8 % on the H200 (9c7f1c1 against 9057bae, 32K bf16 random 8.41 vs 7.93 ms), so bf16 keeps its
// plain conversion. Final outputs are not saturated: an output past its dtype's range is inf, as
// the reference's.
template <StoreKind kKind>
MSA_DEVICE float sat_partial(float x) {
  if constexpr (kKind == StoreKind::kF16) return fabsf(x) <= FLT_MAX ? fminf(fmaxf(x, -65504.0f), 65504.0f) : x;
  return x;
}

// Two values of a partial row packed in the compute dtype, saturated as sat_partial says.
template <typename Elem>
MSA_DEVICE uint32_t pack2_partial(float a, float b) {
  constexpr StoreKind kKind = std::is_same_v<Elem, __nv_bfloat16> ? StoreKind::kBF16 : StoreKind::kF16;
  return pack2<Elem>(sat_partial<kKind>(a), sat_partial<kKind>(b));
}

// kPartial: a split's partial (saturated, sat_partial), not a final output.
template <StoreKind kKind, bool kPartial = false>
MSA_DEVICE void store_pair(uint8_t* dst, float a, float b) {
  if constexpr (kPartial) {
    a = sat_partial<kKind>(a);
    b = sat_partial<kKind>(b);
  }
  if constexpr (kKind == StoreKind::kF32) {
    *reinterpret_cast<float2*>(dst) = make_float2(a, b);
  } else if constexpr (kKind == StoreKind::kBF16) {
    *reinterpret_cast<uint32_t*>(dst) = pack2<__nv_bfloat16>(a, b);
  } else if constexpr (kKind == StoreKind::kF16) {
    *reinterpret_cast<uint32_t*>(dst) = pack2<__half>(a, b);
  } else {
    *reinterpret_cast<__nv_fp8x2_storage_t*>(dst) =
        __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  }
}

// Writes one m16 accumulator tile (16 rows x 128 dims) times mul[h] (per fragment row) as kKind to
// 16 global rows: lane i < 16 holds in row_off the element offset of row i from gbase (< 0: not
// written). Goes through `stage` (this warp's 16 * 128 * bytes of shared memory, 512-byte aligned,
// chunk-swizzled by row like the compute tiles) so that the global stores are whole 16-byte chunks
// of a row. As for ldmatrix, the swizzled address of dims 8d.. is the lane's base address XOR a
// per-d constant (plus 8 bytes for odd d of 1-byte kinds), so no address is kept per d.
template <StoreKind kKind, bool kPartial = false>
MSA_DEVICE void store_rows(const float (&o)[16][4], const float (&mul)[2], uint8_t* stage,
                           void* gbase, int64_t row_off, int lane) {
  constexpr int kE = store_kind_bytes(kKind);
  constexpr int kRowBytes = 128 * kE;
  constexpr int kChunks = kRowBytes / 16;
  const int gid = lane >> 2, tig = lane & 3;
  // Byte of dims (2 tig, 2 tig + 1) in the chunk of d = 0: chunk (2 tig E) / 16, offset (2 tig E) % 16.
  const int chunk0 = (2 * tig * kE) >> 4, within0 = (2 * tig * kE) & 15;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = gid + 8 * h;
    const uint32_t base = smem_addr(stage) + uint32_t(row * kRowBytes) +
                          uint32_t((chunk0 ^ (row & 7)) << 4) + uint32_t(within0);
#pragma unroll
    for (int d = 0; d < 16; ++d) {
      // Dims 8d.. start at byte 8 d E: chunk (d E / 2) for E >= 2 (even for E = 4, chunk0 <= 1),
      // chunk d / 2 plus 8 bytes for odd d when E = 1.
      const uint32_t chunk_inc = kE == 1 ? uint32_t(d >> 1) : uint32_t(d * kE / 2);
      const uint32_t addr = (base ^ (chunk_inc << 4)) + (kE == 1 ? uint32_t(8 * (d & 1)) : 0u);
      uint8_t* dst = stage + (addr - smem_addr(stage));
      store_pair<kKind, kPartial>(dst, o[d][2 * h] * mul[h], o[d][2 * h + 1] * mul[h]);
    }
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < 16 * kChunks / 32; ++i) {
    const int c = lane + 32 * i;
    const int row = c / kChunks, ch = c % kChunks;
    const int64_t ro = __shfl_sync(0xffffffffu, row_off, row);
    const uint4 v = *reinterpret_cast<const uint4*>(stage + row * kRowBytes + ((ch ^ (row & 7)) << 4));
    if (ro >= 0) *reinterpret_cast<uint4*>(static_cast<uint8_t*>(gbase) + ro * kE + ch * 16) = v;
  }
  __syncwarp();
}

template <typename Elem>
inline constexpr StoreKind kElemStoreKind =
    std::is_same_v<Elem, __nv_bfloat16> ? StoreKind::kBF16 : StoreKind::kF16;

}  // namespace flashmsa::sparse_attn
