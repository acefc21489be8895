servetune_test(test_comm LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_comm.cpp ${CMAKE_CURRENT_LIST_DIR}/test_comm_failures.cpp
  LIBS servetune_comm)
