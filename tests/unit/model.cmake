servetune_test(test_weight_slicing LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_weight_slicing.cpp
  LIBS servetune_model)
