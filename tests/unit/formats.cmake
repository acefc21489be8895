servetune_test(test_formats LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gguf.cpp ${CMAKE_CURRENT_LIST_DIR}/test_dtype.cpp
  LIBS servetune_formats)
