servetune_test(test_scheduling LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_block_manager.cpp ${CMAKE_CURRENT_LIST_DIR}/test_scheduler.cpp
  LIBS servetune_scheduling)
servetune_test(test_sampler LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sampler.cpp
  LIBS servetune_runtime)
servetune_test(test_speculative_rollback LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_speculative_rollback.cpp
  LIBS servetune_scheduling)
servetune_test(test_speculator LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_speculator.cpp
  LIBS servetune_runtime)
servetune_test(test_data_parallel_config LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data_parallel_config.cpp
  LIBS servetune_runtime)
servetune_test(test_cpu_sample LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_sample.cpp
  LIBS servetune_runtime)
servetune_test(test_filtered_candidates LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_filtered_candidates.cpp
  LIBS servetune_runtime)
servetune_test(test_replica_parts LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_kv_plan.cpp ${CMAKE_CURRENT_LIST_DIR}/test_engine_stats.cpp
  LIBS servetune_runtime)
