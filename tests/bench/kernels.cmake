# CPU kernel benchmarks: matmul decode (GB/s) and prefill (GFLOP/s) on SmolLM2 shapes, memory bandwidth, pool latency;
# paged attention of a batched decode step (KV bytes/s); token sampling of a decode batch (rows/s).
if(TARGET servetune_backend)
  servetune_bench(bench_matmul SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_matmul.cpp LIBS servetune_backend)
  servetune_bench(bench_attention SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_attention.cpp LIBS servetune_backend)
  servetune_bench(bench_sample SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_sample.cpp LIBS servetune_backend)
endif()
