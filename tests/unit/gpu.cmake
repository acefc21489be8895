# GPU kernel tests (labels unit + gpu): every op of the cuda / hip backend (the MoE / MLA ones in test_gpu_moe_ops,
# draft-tree attention and copy_kv_slots in test_gpu_tree_attention, the tensor-core prefill attention in
# test_gpu_prefill_attention, the FP8 GEMM in test_gpu_fp8), and device sampling, against the CPU reference.
# Built in the cuda and hip presets only; each test skips with a message when no GPU is visible.
servetune_gpu_test(test_gpu_ops LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_ops.cpp
  LIBS servetune_backend)
servetune_gpu_test(test_gpu_sample LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_sample.cpp
  LIBS servetune_runtime)
servetune_gpu_test(test_gpu_moe_ops LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_moe_ops.cpp
  LIBS servetune_backend)
servetune_gpu_test(test_gpu_tree_attention LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_tree_attention.cpp
  LIBS servetune_backend)
servetune_gpu_test(test_gpu_prefill_attention LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_prefill_attention.cpp
  LIBS servetune_backend)
servetune_gpu_test(test_gpu_fp8 LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_fp8.cpp
  LIBS servetune_backend)
