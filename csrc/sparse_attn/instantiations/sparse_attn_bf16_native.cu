// Explicit instantiations of the attention kernels for compute dtype bf16, KV native
// (one translation unit per pair so that they compile in parallel).
#include "sparse_attn/kv_major.cuh"
#include "sparse_attn/kv_major_sm90.cuh"
#include "sparse_attn/launch.h"
#include "sparse_attn/query_major.cuh"
#include "sparse_attn/union_sm90.cuh"

namespace flashmsa::sparse_attn {

template void launch_query_major<__nv_bfloat16, KvKind::kNative, 1>(const QueryMajorArgs&, cudaStream_t);
template void launch_query_major<__nv_bfloat16, KvKind::kNative, 4>(const QueryMajorArgs&, cudaStream_t);
template void launch_kv_major<__nv_bfloat16, KvKind::kNative>(const KvMajorArgs&, int, cudaStream_t);
template void launch_kv_major_sm90<__nv_bfloat16, KvKind::kNative>(const KvMajorArgs&, int, cudaStream_t);
template int kv_major_sm90_ctas_per_sm<__nv_bfloat16, KvKind::kNative>();
template int kv_major_smem_bytes<__nv_bfloat16, KvKind::kNative>(int);
template int kv_major_ctas_per_sm<__nv_bfloat16, KvKind::kNative>(int);
template void launch_union_sm90<__nv_bfloat16, KvKind::kNative>(const UnionArgs&, int, cudaStream_t);
template int union_sm90_ctas_per_sm<__nv_bfloat16, KvKind::kNative>();

}  // namespace flashmsa::sparse_attn
