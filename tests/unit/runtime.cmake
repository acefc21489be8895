servetune_test(test_scheduling LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_block_manager.cpp ${CMAKE_CURRENT_LIST_DIR}/test_scheduler.cpp
  LIBS servetune_scheduling)
servetune_test(test_sampler LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sampler.cpp
  LIBS servetune_runtime)
