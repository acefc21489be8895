servetune_test(test_formats LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gguf.cpp ${CMAKE_CURRENT_LIST_DIR}/test_dtype.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_safetensors.cpp ${CMAKE_CURRENT_LIST_DIR}/test_hf_config.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_mapped_file.cpp ${CMAKE_CURRENT_LIST_DIR}/test_token_map.cpp
  LIBS servetune_formats)
servetune_test(test_quant LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_quant.cpp
  LIBS servetune_formats)
