servetune_test(test_tokenizer LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer.cpp ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer_hf.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer_chat.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer_units.cpp
  LIBS servetune_tokenizer)
