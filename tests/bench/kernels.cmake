# CPU kernel benchmarks: matmul decode (GB/s) and prefill (GFLOP/s) on SmolLM2 shapes, memory bandwidth, pool latency.
if(TARGET servetune_backend)
  servetune_bench(bench_matmul SOURCES ${CMAKE_CURRENT_LIST_DIR}/bench_matmul.cpp LIBS servetune_backend)
endif()
