servetune_test(test_weight_slicing LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_weight_slicing.cpp
  LIBS servetune_model)
servetune_test(test_device_style_loading LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_device_style_loading.cpp
  LIBS servetune_model)
servetune_test(test_moe_routing LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_routing.cpp
  LIBS servetune_model)
servetune_test(test_fp8_loading LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fp8_loading.cpp
  LIBS servetune_model)
servetune_test(test_expert_placement LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_expert_placement.cpp
  LIBS servetune_model)
