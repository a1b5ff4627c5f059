# The GoogleTest filters of the compute-sanitizer runs, sourced by scripts/gpu_check.sh and read by
# bench/compare_builds.py --check: the primitives, one case per feature family, both passes, split
# and not, every sm90 kernel (head dims 64 to 256), and the persistent forward's many-tile cases.
SANITIZER_MEMCHECK='CudaPrimitives.*:Sm90Primitives.*:*CudaAttention.*/square_17:*CudaAttention.*/causal_more_queries:*CudaAttention.*/varlen_with_empty_sequences:*CudaAttention.*/everything:*CudaAttention.*/head_dim_128:*CudaAttention.*/head_dim_256:*CudaAttention.*/many_tiles_causal_gqa:Bfloat16/*/varlen_many_tiles_causal:CudaAttentionRuns.Deterministic*:*CudaAttention.*/prefill_gqa_bhsd_causal_folded'
SANITIZER_RACECHECK='Bfloat16/*/square_17:Bfloat16/*/everything:Bfloat16/*/head_dim_256:Bfloat16/*Forward*/causal_more_queries:*/*Forward*/many_tiles_causal_gqa:Bfloat16/*Forward*/varlen_many_tiles_causal'
SANITIZER_SYNCCHECK='Sm90Primitives.*:Bfloat16/*/square_17:Bfloat16/*/causal_more_queries:Bfloat16/*Forward*/head_dim_256:Bfloat16/*/everything:Bfloat16/*Forward*/many_tiles_causal_gqa:CudaAttentionRuns.Deterministic*:*CudaAttention.*/prefill_gqa_bhsd_causal_folded'
