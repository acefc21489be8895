# CPU kernel tests: the thread pool (core), the CPU matmul kernels (block-scaled FP8 included) and the latent attention
# kernels against their reference (backend), and the GPU split-attention plan and merge, the tensor-core kernels'
# fragment layouts and the prefill attention's tile rule, the grouped expert GEMM's plan and one block walked on a
# simulated warp, the pinned staging ring, and the FP8 GEMM's scale layouts and activation quantization (plain host
# code).
servetune_test(test_thread_pool LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_thread_pool.cpp
  LIBS servetune_core)
if(TARGET servetune_backend AND EXISTS ${CMAKE_CURRENT_LIST_DIR}/test_cpu_matmul.cpp)
  servetune_test(test_cpu_matmul LABEL unit
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_matmul.cpp
    LIBS servetune_backend)
endif()
servetune_test(test_cpu_matmul_fp8 LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_matmul_fp8.cpp
  LIBS servetune_backend)
servetune_test(test_cpu_ops LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_ops.cpp
  LIBS servetune_backend)
servetune_test(test_background_prefetch LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_background_prefetch.cpp
  LIBS servetune_backend)
servetune_test(test_cpu_latent_attention LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_latent_attention.cpp
  LIBS servetune_backend)
servetune_test(test_tree_attention LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tree_attention.cpp
  LIBS servetune_backend)
servetune_test(test_fp8_layout LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fp8_layout.cpp
  LIBS servetune_core)
servetune_test(test_split_attention_plan LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_split_attention_plan.cpp
  LIBS servetune_core)
servetune_test(test_mma_fragments LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mma_fragments.cpp
  LIBS servetune_core)
servetune_test(test_expert_gemm_plan LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_expert_gemm_plan.cpp
  LIBS servetune_core)
servetune_test(test_staging_ring LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_staging_ring.cpp
  LIBS servetune_core)
