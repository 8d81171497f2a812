// Hopper (sm_90a) warpgroup MMA building blocks: wgmma.mma_async m64n128k16 with fp32
// accumulators, bf16 / fp16 operands, A from shared memory (SS) or registers (RS), B from shared
// memory, and the shared-memory matrix descriptors of the 128-byte swizzled layouts the kernels use.
// Valid only when compiled for sm_90a; callers guard with MSA_HAS_WGMMA.
//
// Layout conventions (PTX ISA "Asynchronous Warpgroup Level Matrix Multiply"):
//   * Accumulator D (64 x 128 fp32) of a warpgroup: thread t (warp w = t / 32, gid = lane / 4,
//     tig = lane % 4) holds d[j][e] = D[16 w + gid + 8 (e / 2)][8 j + 2 tig + (e % 2)], j < 16:
//     per warp, exactly the mma.sync m16n8 C fragments of its 16 rows, n8 tile by n8 tile.
//   * Register A (64 x 16, RS): per warp the mma.sync m16n8k16 A fragment of its 16 rows.
//   * Shared tiles: [2][rows][64] 16-bit elements, i.e. head dims 0-63 of every row, then dims
//     64-127, each row 128 bytes; 16-byte chunk c of row r stored at chunk c ^ (r % 8) (the
//     128-byte swizzle, Swizzle<3,4,3> on byte addresses, so tiles must be 1024-byte aligned).
//     Read K-major (dims contiguous: Q and K in S = Q K^T) with SBO = 1024 bytes between 8-row
//     groups, k-step kk at +32 bytes within a 64-dim half; read MN-major (V in O = P V, keys = K,
//     dims = N) with LBO = the half's size between dims 0-63 and 64-127, SBO = 1024 between
//     8-key groups, k-step kk at +2048 bytes.
#pragma once

#include <cstdint>

#include "common/ptx.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MSA_HAS_WGMMA 1
#else
#define MSA_HAS_WGMMA 0
#endif

namespace flashmsa {

// wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading / stride byte
// offsets (16-byte units), layout type 1 in bits 62-63.
MSA_DEVICE uint64_t wgmma_desc_sw128(uint32_t smem_byte_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((smem_byte_addr & 0x3FFFFu) >> 4) | (uint64_t((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         (uint64_t((sbo_bytes >> 4) & 0x3FFFu) << 32) | (uint64_t(1) << 62);
}

// The descriptor of the same layout `byte_off` bytes further on: the start address field (bits
// 0-13, 16-byte units) advanced. A shared-memory address stays below 256 KB, so nothing carries out
// of the field and only the low word changes (one add per k-step instead of a new descriptor).
MSA_DEVICE uint64_t wgmma_desc_advance(uint64_t desc, uint32_t byte_off) {
  return (desc & 0xFFFFFFFF00000000ull) | uint64_t(uint32_t(desc) + (byte_off >> 4));
}

#if MSA_HAS_WGMMA
MSA_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
MSA_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
MSA_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async after its wait)
// visible to the async proxy that wgmma reads operands through; a barrier must follow.
MSA_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// stmatrix .x4 (sm_90): four 8 x 8 16-bit matrices from their mma fragments to shared memory.
// Lane t gives the address of row t % 8 of matrix t / 8 (16 bytes); register i holds this lane's
// fragment of matrix i (row lane / 4, columns 2 (lane % 4) and + 1, packed).
MSA_DEVICE void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Register budget of the calling warpgroup (warp-specialized kernels): dec gives registers back to
// the CTA's pool, inc takes them (waiting until some warpgroup has given them back).
template <int kRegs>
MSA_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
MSA_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Keeps the compiler from moving accumulator reads / writes across wgmma issue and wait.
MSA_DEVICE void wgmma_fence_operand(float (&d)[16][4]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i / 4][i % 4])::"memory");
}
MSA_DEVICE void wgmma_fence_operand(uint32_t (&a)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a[i])::"memory");
}
// The 64 accumulator operands of an m64n128 wgmma: "{%0, ..., %63}" and d[16][4] as "+f" outputs.
#define MSA_WGMMA_D_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define MSA_WGMMA_D_OUTS(d) \
      "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
      "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), \
      "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), \
      "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
      "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), \
      "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), \
      "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), \
      "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), \
      "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), \
      "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), \
      "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), \
      "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), \
      "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), \
      "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])

// The same 64 operands write-only ("=f"): D = A B, the old values neither read nor kept alive.
#define MSA_WGMMA_D_NEW(d) \
      "=f"(d[0][0]), "=f"(d[0][1]), "=f"(d[0][2]), "=f"(d[0][3]), \
      "=f"(d[1][0]), "=f"(d[1][1]), "=f"(d[1][2]), "=f"(d[1][3]), \
      "=f"(d[2][0]), "=f"(d[2][1]), "=f"(d[2][2]), "=f"(d[2][3]), \
      "=f"(d[3][0]), "=f"(d[3][1]), "=f"(d[3][2]), "=f"(d[3][3]), \
      "=f"(d[4][0]), "=f"(d[4][1]), "=f"(d[4][2]), "=f"(d[4][3]), \
      "=f"(d[5][0]), "=f"(d[5][1]), "=f"(d[5][2]), "=f"(d[5][3]), \
      "=f"(d[6][0]), "=f"(d[6][1]), "=f"(d[6][2]), "=f"(d[6][3]), \
      "=f"(d[7][0]), "=f"(d[7][1]), "=f"(d[7][2]), "=f"(d[7][3]), \
      "=f"(d[8][0]), "=f"(d[8][1]), "=f"(d[8][2]), "=f"(d[8][3]), \
      "=f"(d[9][0]), "=f"(d[9][1]), "=f"(d[9][2]), "=f"(d[9][3]), \
      "=f"(d[10][0]), "=f"(d[10][1]), "=f"(d[10][2]), "=f"(d[10][3]), \
      "=f"(d[11][0]), "=f"(d[11][1]), "=f"(d[11][2]), "=f"(d[11][3]), \
      "=f"(d[12][0]), "=f"(d[12][1]), "=f"(d[12][2]), "=f"(d[12][3]), \
      "=f"(d[13][0]), "=f"(d[13][1]), "=f"(d[13][2]), "=f"(d[13][3]), \
      "=f"(d[14][0]), "=f"(d[14][1]), "=f"(d[14][2]), "=f"(d[14][3]), \
      "=f"(d[15][0]), "=f"(d[15][1]), "=f"(d[15][2]), "=f"(d[15][3])

// One asm statement per (A source, operand type); TY is the PTX type of A and B (bf16 / f16).
#define MSA_WGMMA_SS(TY)                                                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " MSA_WGMMA_D_REGS \
               ", %64, %65, p, 1, 1, 0, %67;\n}\n"                                              \
               : MSA_WGMMA_D_OUTS(d)                                                          \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB))
#define MSA_WGMMA_RS(TY)                                                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                  \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " MSA_WGMMA_D_REGS \
               ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"                                \
               : MSA_WGMMA_D_OUTS(d)                                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTransB))

// D (+)= A B for a 64 x 128 x 16 step, A and B from shared memory. scale_d = 0: D = A B.
// kTransB = 0: B is K-major ([n][k], k contiguous); 1: MN-major ([k][n], n contiguous).
template <typename Elem, int kTransB>
MSA_DEVICE void wgmma_m64n128k16_ss(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    MSA_WGMMA_SS("bf16");
  } else {
    static_assert(std::is_same_v<Elem, __half>, "MMA dtype is bf16 or fp16");
    MSA_WGMMA_SS("f16");
  }
}

// D = A B (scale-d 0) with D write-only: for a first k-step into an array whose old values are
// dead, so that they are not kept alive (registers) up to the MMA. B K-major.
template <typename Elem>
MSA_DEVICE void wgmma_m64n128k16_ss_new(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MSA_WGMMA_D_REGS
                 ", %64, %65, 0, 1, 1, 0, 0;\n"
                 : MSA_WGMMA_D_NEW(d)
                 : "l"(desc_a), "l"(desc_b));
  } else {
    static_assert(std::is_same_v<Elem, __half>, "MMA dtype is bf16 or fp16");
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " MSA_WGMMA_D_REGS
                 ", %64, %65, 0, 1, 1, 0, 0;\n"
                 : MSA_WGMMA_D_NEW(d)
                 : "l"(desc_a), "l"(desc_b));
  }
}

// The same with A (this warp's 16 rows x 16 k, the mma.sync A fragment) from registers.
template <typename Elem, int kTransB>
MSA_DEVICE void wgmma_m64n128k16_rs(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>) {
    MSA_WGMMA_RS("bf16");
  } else {
    static_assert(std::is_same_v<Elem, __half>, "MMA dtype is bf16 or fp16");
    MSA_WGMMA_RS("f16");
  }
}

#undef MSA_WGMMA_SS
#undef MSA_WGMMA_RS
#undef MSA_WGMMA_D_OUTS
#undef MSA_WGMMA_D_NEW
#undef MSA_WGMMA_D_REGS
#endif  // MSA_HAS_WGMMA

}  // namespace flashmsa
