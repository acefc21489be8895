servetune_test(test_comm LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm.cpp ${CMAKE_CURRENT_LIST_DIR}/test_comm_failures.cpp
  LIBS servetune_comm)
if(SERVETUNE_WITH_NCCL)
  target_compile_definitions(test_comm PRIVATE SERVETUNE_WITH_NCCL)  # test_comm_failures checks the nccl build's errors
endif()
