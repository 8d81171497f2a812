// The register-converting variant of the query-major kernel for fp8 and NVFP4 K/V (decode;
// selected by the decode plan option kernel=regs, docs/design/sparse_attention.md "Decode at
// memory speed"; NVFP4: see qk_nvfp4_regs below):
//   * raw e4m3 tiles stay in shared memory ([keys][128 bytes], 16-byte chunk c of key r at chunk
//     c ^ (r % 8)); no dequantized copy, no conversion pass, no extra barrier per tile;
//   * each warp reads the raw bytes of its keys into registers and converts them straight into
//     mma.sync B fragments with one cvt.rn.f16x2.e4m3x2 per pair of values (exact);
//   * the MMAs run in fp16 whatever q's dtype: every e4m3 value is an fp16 value, and bf16 q rows
//     are scaled by a power of two into fp16 (below), so no fp16 -> fp32 -> bf16 chain (3 more
//     instructions per pair, the largest cost of the shared-memory variant) is needed;
//   * the head dims of Q K^T and of P V are permuted (the same permutation on both operands of a
//     dot product, undone by the epilogue store) so that every lane reads whole 16-byte chunks.
//
// The tiles are whole 128-key blocks, each warp takes 32 keys of each. Layout of a warp's keys
// key0 .. (n-tile nt = keys key0 + 8 nt ..), gid = lane / 4, tig = lane % 4:
//   Q K^T, k-step kk (of 8): the m16n8k16 k index 2 tig + e (+ 8) stands for head dim
//     32 tig + 4 kk + e (+ 2). B fragment of n-tile nt: key key0 + 8 nt + gid, dims 32 tig .. + 31:
//     two 16-byte loads; 4 bytes per k-step, one cvt per register. The Q fragments follow the same
//     map (built once per item as fp16, kept in shared memory in fragment order).
//   P V, per 16 keys: n-tile j (of 16), column n stands for head dim 16 n + j. The B fragment of a
//     lane is (keys 2 tig, 2 tig + 1 | 2 tig + 8, 2 tig + 9) x dim 16 gid + j: four 16-byte loads
//     (chunk gid of 4 key rows), pairs interleaved by prmt, one cvt per register. Accumulator o[j][2h + e]
//     is row gid + 8 h, head dim 32 tig + 16 e + j (store_rows_perm writes it back in order).
//
// bf16 q -> fp16: row h's elements are multiplied by 2^(14 - E), E = the exponent of the row's
// largest |q| (common/ptx.cuh f16_row_scale: exact for every element >= 2^-32 of its row maximum).
// The logits are multiplied back by 2^(E - 14) (folded into the softmax scale per row). P is
// rounded to fp16 (11 significant bits) instead of bf16 (8) for P V: closer to the exact softmax
// than the shared-memory variant. fp16 q goes into the fragments as it is.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/e2m1_word.cuh"
#include "sparse_attn/attention_core.cuh"

namespace flashmsa::sparse_attn {

// Lazy softmax rescaling (softmax_step's slack, the KV-major kernel's rule): a row's reference max
// moves only when a step's max exceeds it by more than 8 (P <= 2^8, exact in fp16), which skips
// most of the 64 o-rescaling multiplies per thread and step; 8 / T for a temperature T > 1 (the
// temperature terms are 2^(T (x - m))), 0 (eager) for a T <= 0 the validator would have refused.
MSA_DEVICE float regs_rescale_slack(bool has_temp, float temp) {
  constexpr float kSlack = 8.0f;
  return !has_temp ? kSlack : (temp > 1.0f ? kSlack / temp : (temp > 0.0f ? kSlack : 0.0f));
}

// Both halves of w (two e4m3 pairs) to fp16 pairs: lo <- bytes 0, 1; hi <- bytes 2, 3. The halves
// are split inside the asm so that ptxas can read the upper one in place (no shift per pair).
MSA_DEVICE void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  lo = e4m3x2_to_f16x2_bits(uint16_t(w & 0xFFFFu));
  hi = e4m3x2_to_f16x2_bits(uint16_t(w >> 16));
#endif
}

// Byte offset of 16-byte chunk ch of key `row` in a raw e4m3 tile.
MSA_DEVICE uint32_t raw8_at(int row, int ch) {
  return uint32_t(row) * 128u + (uint32_t(ch ^ (row & 7)) << 4);
}

// cp.async of keys [0, kRows) of one raw e4m3 K or V tile at element (= byte) offset `off` of `t`
// into the chunk-swizzled raw layout at `dst`; keys >= n_valid are zero-filled (never read).
template <int kRows, int kThreads>
MSA_DEVICE void issue_fp8_rows_swizzled(const KVTensor& t, int64_t off, int n_valid, uint32_t dst,
                                        int tid) {
  static_assert((kRows * 8) % kThreads == 0 && kThreads % 64 == 0, "whole chunks per thread");
  // Thread tid copies chunk tid % 8 of rows tid / 8 + i * kThreads / 8: the row's swizzle (row % 8)
  // and the chunk are the same for every i, so source and destination advance by constants.
  constexpr int kRowStep = kThreads / 8;
  const uint8_t* base = static_cast<const uint8_t*>(t.data);
  const int row0 = tid >> 3, ch = tid & 7;
  const uint8_t* src = base + off + int64_t(row0) * t.stride_token + ch * 16;
  const int64_t src_step = int64_t(kRowStep) * t.stride_token;
  const uint32_t dst0 = dst + raw8_at(row0, ch);
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
    const bool ok = row0 + i * kRowStep < n_valid;
    cp_async_16_zfill(dst0 + uint32_t(i * kRowStep * 128), ok ? src : base, ok);
    src += src_step;
  }
}

// The warp's Q fragments for the permuted Q K^T (rows row0 .. row0 + 15 of the [rows][128] Q tile
// sQ, in q's compute dtype Elem) as fp16, and per fragment row h (gid, gid + 8) the factor that
// turns the fp16 logits back into base-2 softmax units: scale_log2 * 2^(E - 14) for bf16 q,
// scale_log2 for fp16 q.
template <typename Elem>
MSA_DEVICE void load_q_frags_f16(const uint8_t* sQ, int row0, int lane, float scale_log2,
                                 uint32_t (&qa)[8][4], float (&row_mul)[2]) {
  const int gid = lane >> 2, tig = lane & 3;
  // Dims 32 tig + 4 kk .. + 3 of row r: 8 bytes in chunk 4 tig + kk / 2.
  auto at = [&](int h, int kk) {
    const int row = row0 + gid + 8 * h;
    return *reinterpret_cast<const uint2*>(sQ + swizzle_128x16b_bytes(row, 4 * tig + (kk >> 1)) +
                                           (kk & 1) * 8);
  };
  if constexpr (std::is_same_v<Elem, __half>) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const uint2 v = at(h, kk);
        qa[kk][h] = v.x;
        qa[kk][2 + h] = v.y;
      }
      row_mul[h] = scale_log2;
    }
  } else {
    static_assert(std::is_same_v<Elem, __nv_bfloat16>, "q computes in bf16 or fp16");
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = 0.0f;
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const uint2 v = at(h, kk);
        mx = fmaxf(mx, fmaxf(bf16x2_abs_max(v.x), bf16x2_abs_max(v.y)));
      }
      const F16RowScale rs = f16_row_scale(quad_max(mx));  // common/ptx.cuh
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        const uint2 v = at(h, kk);
        qa[kk][h] = bf16x2_scaled_to_f16x2(v.x, rs.up);
        qa[kk][2 + h] = bf16x2_scaled_to_f16x2(v.y, rs.up);
      }
      row_mul[h] = scale_log2 * rs.down;
    }
  }
}

// The fragments of load_q_frags_f16 in shared memory, in fragment order: k-step kk of lane l is the
// 16 bytes at (kk * 32 + l) * 16 (4 KB; every warp of a 16-row item holds the same fragments, so
// one copy serves all, read with conflict-free 16-byte loads). Keeping them in 32 registers
// instead spilled at the 168-register cap of 3 CTAs per SM.
MSA_DEVICE void stash_q_frags(const uint32_t (&qa)[8][4], uint8_t* sQf, int lane) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk)
    *reinterpret_cast<uint4*>(sQf + (kk * 32 + lane) * 16) =
        make_uint4(qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3]);
}

// k-step kk's A fragment of this lane from stash_q_frags' buffer.
MSA_DEVICE void stashed_q_frag(const uint8_t* sQf, int kk, int lane, uint32_t (&a)[4]) {
  const uint4 q = *reinterpret_cast<const uint4*>(sQf + (kk * 32 + lane) * 16);
  a[0] = q.x;
  a[1] = q.y;
  a[2] = q.z;
  a[3] = q.w;
}

// s[nt] = Q K^T for the warp's kNT * 8 keys key0 .. of the raw K tile sK (fp16 MMAs, permuted dims;
// Q fragments from stash_q_frags' buffer sQf). Two n-tiles (16 keys) at a time bound the raw
// registers to 16.
template <int kNT>
MSA_DEVICE void qk_fp8_regs(float (&s)[kNT][4], const uint8_t* sQf, const uint8_t* sK, int key0,
                            int lane) {
  static_assert(kNT % 2 == 0, "n-tiles in pairs");
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int np = 0; np < kNT / 2; ++np) {
    uint32_t w[2][8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int nt = 2 * np + h;
      const int key = key0 + 8 * nt + gid;
      const uint4 r0 = *reinterpret_cast<const uint4*>(sK + raw8_at(key, 2 * tig));
      const uint4 r1 = *reinterpret_cast<const uint4*>(sK + raw8_at(key, 2 * tig + 1));
      w[h][0] = r0.x; w[h][1] = r0.y; w[h][2] = r0.z; w[h][3] = r0.w;
      w[h][4] = r1.x; w[h][5] = r1.y; w[h][6] = r1.z; w[h][7] = r1.w;
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      uint32_t a[4];
      stashed_q_frag(sQf, kk, lane, a);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t b0, b1;
        e4m3x4_to_f16x2x2(w[h][kk], b0, b1);
        mma_m16n8k16<__half>(s[2 * np + h], a, b0, b1);
      }
    }
  }
}

// The online softmax of a register-kernel step: the fp16 logits s of qk_fp8_regs / qk_nvfp4_regs
// times each fragment row's factor (load_q_frags_f16's row_mul: base-2 softmax units), then
// softmax_step with the lazy rescale (regs_rescale_slack).
template <int kNT, int kON>
MSA_DEVICE void regs_softmax_step(float (&s)[1][kNT][4], float (&o)[1][kON][4], SoftmaxState<1>& st,
                                  const int (&lim)[1][2], const float (&row_mul)[2], bool has_temp,
                                  float temp, int lane) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[0][nt][e] *= row_mul[e >> 1];
  softmax_step<1, kNT>(s, o, st, lim, 1.0f, has_temp, temp, lane, regs_rescale_slack(has_temp, temp));
}

// The A fragments of P V for keys 16 ks .. + 15 of the warp's step (n-tiles 2 ks, 2 ks + 1 of the
// Q K^T accumulators), P rounded to fp16.
template <int kNT>
MSA_DEVICE void p_frags_f16(const float (&p)[kNT][4], int ks, uint32_t (&a)[4]) {
  a[0] = pack2<__half>(p[2 * ks][0], p[2 * ks][1]);
  a[1] = pack2<__half>(p[2 * ks][2], p[2 * ks][3]);
  a[2] = pack2<__half>(p[2 * ks + 1][0], p[2 * ks + 1][1]);
  a[3] = pack2<__half>(p[2 * ks + 1][2], p[2 * ks + 1][3]);
}

// o += P V for the warp's kNT * 8 keys key0 .. of the raw V tile sV; P (already exponentiated) in
// p, rounded to fp16. o[j] are the permuted head dims of the file comment.
template <int kNT>
MSA_DEVICE void pv_fp8_regs(float (&o)[16][4], const float (&p)[kNT][4], const uint8_t* sV, int key0,
                            int lane) {
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int ks = 0; ks < kNT / 2; ++ks) {
    uint32_t a[4];
    p_frags_f16(p, ks, a);
    const int k0 = key0 + 16 * ks + 2 * tig, k1 = k0 + 8;
    const uint4 va = *reinterpret_cast<const uint4*>(sV + raw8_at(k0, gid));
    const uint4 vb = *reinterpret_cast<const uint4*>(sV + raw8_at(k0 + 1, gid));
    const uint4 vc = *reinterpret_cast<const uint4*>(sV + raw8_at(k1, gid));
    const uint4 vd = *reinterpret_cast<const uint4*>(sV + raw8_at(k1 + 1, gid));
    const uint32_t wa[4] = {va.x, va.y, va.z, va.w}, wb[4] = {vb.x, vb.y, vb.z, vb.w};
    const uint32_t wc[4] = {vc.x, vc.y, vc.z, vc.w}, wd[4] = {vd.x, vd.y, vd.z, vd.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      // Bytes j = 4q .. 4q + 3 of the key pairs (k0, k0 + 1) and (k1, k1 + 1), interleaved per dim.
      const uint32_t x0 = __byte_perm(wa[q], wb[q], 0x5140), x1 = __byte_perm(wa[q], wb[q], 0x7362);
      const uint32_t y0 = __byte_perm(wc[q], wd[q], 0x5140), y1 = __byte_perm(wc[q], wd[q], 0x7362);
      uint32_t bx[4], by[4];
      e4m3x4_to_f16x2x2(x0, bx[0], bx[1]);
      e4m3x4_to_f16x2x2(x1, bx[2], bx[3]);
      e4m3x4_to_f16x2x2(y0, by[0], by[1]);
      e4m3x4_to_f16x2x2(y1, by[2], by[3]);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) mma_m16n8k16<__half>(o[4 * q + jj], a, bx[jj], by[jj]);
    }
  }
}

// ---- MTP union items, cooperative (query_major.cuh QueryMajorConfig::kCoop) --------------------
// 64 query rows (4 m tiles; the stash_q_frags buffers of the 4 warps at sQf + kQFragBytes * mt)
// against a raw 128-key fp8 block, the work split so that each converted fragment feeds all 4 m
// tiles instead of one:
//   Q K^T: warp w takes keys 32 w .. + 31 of every row (the key layout of qk_fp8_regs);
//   P V:   warp w takes head dims 32 w .. + 31 of every row. n-tile j (of 4), column n stands for
//          dim 32 w + 4 n + j: lane (gid, tig) reads the 4 bytes at dim 32 w + 4 gid of keys
//          2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9 of each 16-key step, the key pairs interleaved by
//          prmt as in pv_fp8_regs. Accumulator o[mt][j][2h + e] is row 16 mt + gid + 8 h, head dim
//          32 w + 8 tig + 4 e + j (8 consecutive dims per row and lane: no permutation to undo).
// P (already exponentiated) comes from shared memory: [64 rows][128 keys] fp16 in the Q tile's
// layout (16-byte chunks swizzled, ldm_base_a), written by p_store_f16 of every warp. Every m tile
// is computed for every block: rows whose token did not select it are masked (P = 0).
// Addresses: key0 and dim0 are multiples of 32, so a lane's key or row % 8 is the same for every
// n-tile and step, and the swizzles fold into per-lane offsets plus immediates.
inline constexpr int kQFragBytes = 8 * 32 * 16;  // one warp's stash_q_frags buffer

template <int kMT, int kNT>
MSA_DEVICE void qk_fp8_regs_rows(float (&s)[kMT][kNT][4], const uint8_t* sQf, const uint8_t* sK,
                                 int key0, int lane) {
  const int gid = lane >> 2, tig = lane & 3;
  // Key key0 + 8 nt + gid (% 8 = gid): chunks 2 tig and 2 tig + 1 (raw8_at).
  const uint8_t* k_row = sK + (key0 + gid) * 128;
  const int c0 = (2 * tig) ^ gid, c1 = (2 * tig + 1) ^ gid;
  uint32_t w[kNT][8];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const uint4 r0 = *reinterpret_cast<const uint4*>(k_row + nt * 8 * 128 + c0 * 16);
    const uint4 r1 = *reinterpret_cast<const uint4*>(k_row + nt * 8 * 128 + c1 * 16);
    w[nt][0] = r0.x; w[nt][1] = r0.y; w[nt][2] = r0.z; w[nt][3] = r0.w;
    w[nt][4] = r1.x; w[nt][5] = r1.y; w[nt][6] = r1.z; w[nt][7] = r1.w;
  }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    uint32_t b[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) e4m3x4_to_f16x2x2(w[nt][kk], b[nt][0], b[nt][1]);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      uint32_t a[4];
      stashed_q_frag(sQf + mt * kQFragBytes, kk, lane, a);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mma_m16n8k16<__half>(s[mt][nt], a, b[nt][0], b[nt][1]);
    }
  }
}

// P of the warp's keys key0 .. + 8 kNT - 1 (s after softmax_step) as fp16 into the [64][128] P tile
// at sP (256-byte aligned): row 16 mt + 8 h + gid (% 8 = gid), chunk key0 / 8 + nt, bytes 4 tig.
template <int kMT, int kNT>
MSA_DEVICE void p_store_f16(const float (&p)[kMT][kNT][4], uint8_t* sP, int key0, int lane) {
  static_assert(kNT <= 4, "chunk key0 / 8 + nt = (key0 / 8) ^ nt");
  const int gid = lane >> 2, tig = lane & 3;
  const uint32_t base = uint32_t(gid) * 256u + (uint32_t((key0 >> 3) ^ gid) << 4) + 4u * tig;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    // The row offsets (multiples of 256) leave the chunk bits alone: XOR once per n-tile.
    uint8_t* at = sP + (base ^ uint32_t(nt << 4));
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<uint32_t*>(at + (16 * mt + 8 * h) * 256) =
            pack2<__half>(p[mt][nt][2 * h], p[mt][nt][2 * h + 1]);
  }
}

// o[mt][j] += P V for head dims dim0 .. + 31 (dim0 = 32 w) over the 128 keys of the raw V block sV;
// P from the tile at shared address sP_addr (256-byte aligned).
template <int kMT>
MSA_DEVICE void pv_fp8_regs_dims(float (&o)[kMT][4][4], uint32_t sP_addr, const uint8_t* sV, int dim0,
                                 int lane) {
  const int gid = lane >> 2, tig = lane & 3;
  // Dim dim0 + 4 gid: chunk dim0 / 16 + gid / 4, bytes 4 (gid % 4) of keys 16 ks + 2 tig (+ 1)
  // (% 8 = 2 tig (+ 1)) and 8 keys further.
  const int ch = (dim0 >> 4) + (gid >> 2);
  const uint8_t* va = sV + (2 * tig) * 128 + ((ch ^ (2 * tig)) << 4) + 4 * (gid & 3);
  const uint8_t* vb = sV + (2 * tig + 1) * 128 + ((ch ^ (2 * tig + 1)) << 4) + 4 * (gid & 3);
  const uint32_t a_base = ldm_base_a(sP_addr, 0, lane);
#pragma unroll
  for (int ks = 0; ks < kBlockSize / 16; ++ks) {
    const uint32_t wa = *reinterpret_cast<const uint32_t*>(va + ks * 16 * 128);
    const uint32_t wb = *reinterpret_cast<const uint32_t*>(vb + ks * 16 * 128);
    const uint32_t wc = *reinterpret_cast<const uint32_t*>(va + ks * 16 * 128 + 8 * 128);
    const uint32_t wd = *reinterpret_cast<const uint32_t*>(vb + ks * 16 * 128 + 8 * 128);
    // Dims j = 0..3 of the key pairs (k0, k0 + 1) and (k0 + 8, k0 + 9), interleaved per dim.
    uint32_t bx[4], by[4];
    e4m3x4_to_f16x2x2(__byte_perm(wa, wb, 0x5140), bx[0], bx[1]);
    e4m3x4_to_f16x2x2(__byte_perm(wa, wb, 0x7362), bx[2], bx[3]);
    e4m3x4_to_f16x2x2(__byte_perm(wc, wd, 0x5140), by[0], by[1]);
    e4m3x4_to_f16x2x2(__byte_perm(wc, wd, 0x7362), by[2], by[3]);
    const uint32_t a_step = a_base ^ uint32_t(ks << 5);  // the m tiles' rows: + 4096 mt, no carry
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      uint32_t a[4];
      ldmatrix_x4(a, a_step + uint32_t(mt * 16 * 256));
#pragma unroll
      for (int j = 0; j < 4; ++j) mma_m16n8k16<__half>(o[mt][j], a, bx[j], by[j]);
    }
  }
}

// ---- NVFP4 K/V -------------------------------------------------------------------------------
// Raw tiles of 128 keys as issue_kv_rows writes them: [keys][64] bytes of e2m1 pairs (low nibble =
// even element), then [keys][8] e4m3 block scales (scale j covers dims 16 j .. 16 j + 15). A value
// enters the fp16 MMAs as value x 2^-7 (common/ptx.cuh: the code placed as an fp16 number times
// the block scale x 2^7 in one HMUL2, exact); the logits and the output are multiplied back by
// kNvfp4RegsUnscale (query_major.cuh). The same permuted
// head dims as the fp8 functions above, so the Q fragments and store_rows_perm are shared.
inline constexpr float kNvfp4RegsUnscale = 128.0f;

// The two e2m1 values of byte j (0..3) of w, times the scale pair s2, as an fp16 pair x 2^-7
// (common/ptx.cuh e2m1x2_code_bits, nvfp4_scale_pair_x128).
MSA_DEVICE uint32_t e2m1_byte_scaled(uint32_t w, int j, uint32_t s2) {
  return hmul2_bits(e2m1x2_code_bits(__byte_perm(w, 0u, 0x4440u | uint32_t(j))), s2);
}

// kWord (decode plan option nvfp4_cvt=word): the same tiles, loads, scales, 2^-7 placement and
// HMUL2, the codes converted a 32-bit word (8 codes) at a time by common/e2m1_word.cuh (shared with
// the proxy-score decode kernel). A word yields the nibble pairs (i, i + 4) (dims d, d + 4), so
// Q K^T takes a k-step's dims in that order (q_frags_word_order permutes the Q fragments to match:
// the same dot products, summed in another order by the MMA). P V pairs keys: a lane first
// interleaves bytes q, q + 1 of two keys into one word ([a q, a q+1, b q, b q+1], one prmt per 4
// pairs instead of 2), and its B fragments, n-tiles and MMA order are the byte conversion's, bit
// for bit.

// s[nt] = Q K^T x 2^-7 for the warp's kNT * 8 keys key0 .. of the raw NVFP4 K tile sK (128 keys).
// Lane (gid, tig) of n-tile nt reads key key0 + 8 nt + gid: dims 32 tig .. + 31 are the 16 bytes
// at 16 tig of its row and scale columns 2 tig (words 0, 1) and 2 tig + 1 (words 2, 3). A byte at
// a time, k-step kk takes bytes 2 kk and 2 kk + 1 for b0 and b1; kWord: word m gives k-steps 2 m
// (nibble pairs 0, 4 and 1, 5) and 2 m + 1 (2, 6 and 3, 7).
template <int kNT, bool kWord = false>
MSA_DEVICE void qk_nvfp4_regs(float (&s)[kNT][4], const uint8_t* sQf, const uint8_t* sK, int key0,
                              int lane) {
  static_assert(kNT % 2 == 0, "n-tiles in pairs");
  const int gid = lane >> 2, tig = lane & 3;
  const uint8_t* scales = sK + kBlockSize * 64;
#pragma unroll
  for (int np = 0; np < kNT / 2; ++np) {
    uint32_t w[2][4], sc[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = key0 + 8 * (2 * np + h) + gid;
      const uint4 r = *reinterpret_cast<const uint4*>(sK + key * 64 + tig * 16);
      w[h][0] = r.x; w[h][1] = r.y; w[h][2] = r.z; w[h][3] = r.w;
      const uint32_t f = nvfp4_scale_pair_x128(*reinterpret_cast<const uint16_t*>(scales + key * 8 + 2 * tig));
      if constexpr (kWord) {
        sc[h][0] = sc[h][1] = f;  // {scale 2 tig, scale 2 tig + 1}, halves selected by the HMUL2
      } else {
        sc[h][0] = __byte_perm(f, 0u, 0x1010u);  // {scale 2 tig, scale 2 tig}
        sc[h][1] = __byte_perm(f, 0u, 0x3232u);  // {scale 2 tig + 1, scale 2 tig + 1}
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[2 * np + h][e] = 0.0f;
    }
    if constexpr (kWord) {
#pragma unroll
      for (int m = 0; m < 4; ++m) {  // k-steps 2 m, 2 m + 1
        uint32_t lo[2], hi[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          lo[h] = e2m1_lo_codes(w[h][m]);
          hi[h] = e2m1_hi_codes(w[h][m]);
        }
#pragma unroll
        for (int odd = 0; odd < 2; ++odd) {
          uint32_t a[4];
          stashed_q_frag(sQf, 2 * m + odd, lane, a);
#pragma unroll
          for (int h = 0; h < 2; ++h)
            mma_m16n8k16<__half>(
                s[2 * np + h], a, hmul2_half_bits(odd ? codes_13(lo[h]) : codes_02(lo[h]), sc[h][0], m >> 1),
                hmul2_half_bits(odd ? codes_13(hi[h]) : codes_02(hi[h]), sc[h][0], m >> 1));
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        uint32_t a[4];
        stashed_q_frag(sQf, kk, lane, a);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t word = w[h][kk >> 1], s2 = sc[h][kk >> 2];
          const int j = 2 * (kk & 1);
          mma_m16n8k16<__half>(s[2 * np + h], a, e2m1_byte_scaled(word, j, s2),
                               e2m1_byte_scaled(word, j + 1, s2));
        }
      }
    }
  }
}

// o += P V x 2^-7 for the warp's kNT * 8 keys key0 .. of the raw NVFP4 V tile sV (128 keys); P in
// p, rounded to fp16. Per 16 keys a lane reads, of keys k0 = key0 + 16 ks + 2 tig, k0 + 1, k0 + 8
// and k0 + 9, the 8 bytes at 8 gid (dims 16 gid .. + 15, scale column gid): n-tile j takes nibble
// j % 2 of byte j / 2 of each, the key pairs interleaved by prmt (a byte at a time: bytes at bits
// 0..7 and 16..23; kWord: bytes q, q + 1 of each key in one word).
template <int kNT, bool kWord = false>
MSA_DEVICE void pv_nvfp4_regs(float (&o)[16][4], const float (&p)[kNT][4], const uint8_t* sV, int key0,
                              int lane) {
  const int gid = lane >> 2, tig = lane & 3;
  const uint8_t* scales = sV + kBlockSize * 64;
#pragma unroll
  for (int ks = 0; ks < kNT / 2; ++ks) {
    uint32_t a[4];
    p_frags_f16(p, ks, a);
    const int k0 = key0 + 16 * ks + 2 * tig, k1 = k0 + 8;
    const uint2 va = *reinterpret_cast<const uint2*>(sV + k0 * 64 + gid * 8);
    const uint2 vb = *reinterpret_cast<const uint2*>(sV + (k0 + 1) * 64 + gid * 8);
    const uint2 vc = *reinterpret_cast<const uint2*>(sV + k1 * 64 + gid * 8);
    const uint2 vd = *reinterpret_cast<const uint2*>(sV + (k1 + 1) * 64 + gid * 8);
    // Scale pairs {key k0, key k0 + 1} and {k1, k1 + 1} of column gid.
    const uint32_t sx = nvfp4_scale_pair_x128(uint32_t(scales[k0 * 8 + gid]) | (uint32_t(scales[(k0 + 1) * 8 + gid]) << 8));
    const uint32_t sy = nvfp4_scale_pair_x128(uint32_t(scales[k1 * 8 + gid]) | (uint32_t(scales[(k1 + 1) * 8 + gid]) << 8));
    const uint32_t wa[2] = {va.x, va.y}, wb[2] = {vb.x, vb.y}, wc[2] = {vc.x, vc.y}, wd[2] = {vd.x, vd.y};
    if constexpr (kWord) {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        // Bytes q, q + 1 (q = 2 t: dims 16 gid + 2 q .. + 3) of both keys of a pair.
        const uint32_t sel = (t & 1) ? 0x7632u : 0x5410u;
        const uint32_t x = __byte_perm(wa[t >> 1], wb[t >> 1], sel);
        const uint32_t y = __byte_perm(wc[t >> 1], wd[t >> 1], sel);
        const uint32_t xh = e2m1_hi_codes(x), xl = e2m1_lo_codes(x);
        const uint32_t yh = e2m1_hi_codes(y), yl = e2m1_lo_codes(y);
        const int q = 2 * t;  // n-tiles 2 q (low nibbles of byte q), 2 q + 1 (high), 2 q + 2, 2 q + 3
        mma_m16n8k16<__half>(o[2 * q], a, hmul2_bits(codes_02(xl), sx), hmul2_bits(codes_02(yl), sy));
        mma_m16n8k16<__half>(o[2 * q + 1], a, hmul2_bits(codes_02(xh), sx), hmul2_bits(codes_02(yh), sy));
        mma_m16n8k16<__half>(o[2 * q + 2], a, hmul2_bits(codes_13(xl), sx), hmul2_bits(codes_13(yl), sy));
        mma_m16n8k16<__half>(o[2 * q + 3], a, hmul2_bits(codes_13(xh), sx), hmul2_bits(codes_13(yh), sy));
      }
    } else {
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        // Byte q (dims 16 gid + 2q, + 1) of both keys of a pair at bits 0..7 and 16..23.
        const uint32_t sel = uint32_t(q & 3) | (uint32_t(4 + (q & 3)) << 8);
        const uint32_t x = __byte_perm(wa[q >> 2], wb[q >> 2], sel);
        const uint32_t y = __byte_perm(wc[q >> 2], wd[q >> 2], sel);
        // n-tile 2q: the low nibbles; 2q + 1: the high nibbles.
        mma_m16n8k16<__half>(o[2 * q], a, hmul2_bits(e2m1_pair_code_bits(x), sx),
                             hmul2_bits(e2m1_pair_code_bits(y), sy));
        mma_m16n8k16<__half>(o[2 * q + 1], a, hmul2_bits(e2m1_pair_code_bits(x >> 4), sx),
                             hmul2_bits(e2m1_pair_code_bits(y >> 4), sy));
      }
    }
  }
}

// store_rows for accumulators in the permuted head-dim order of pv_fp8_regs: o[j][2h + e] is row
// gid + 8h, dim 32 tig + 16 e + j. Same staging layout and global stores as store_rows.
template <StoreKind kKind, bool kPartial = false>
MSA_DEVICE void store_rows_perm(const float (&o)[16][4], const float (&mul)[2], uint8_t* stage,
                                void* gbase, int64_t row_off, int lane) {
  constexpr int kE = store_kind_bytes(kKind);
  constexpr int kRowBytes = 128 * kE;
  constexpr int kChunks = kRowBytes / 16;
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = gid + 8 * h;
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int j = 0; j < 16; j += 2) {
        const int b = (32 * tig + 16 * e + j) * kE;  // dims d, d + 1 are adjacent
        uint8_t* dst = stage + row * kRowBytes + (((b >> 4) ^ (row & 7)) << 4) + (b & 15);
        store_pair<kKind, kPartial>(dst, o[j][2 * h + e] * mul[h], o[j + 1][2 * h + e] * mul[h]);
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

}  // namespace flashmsa::sparse_attn
