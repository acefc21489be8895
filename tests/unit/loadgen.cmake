# Datasets and load generator tests: datasets (tokenizer only), metrics / SSE / report, the libcurl client against
# the mock server, the in-process client on stories260K, the pieces of perplexity against a server (top-K KL,
# prompt_logprobs responses, the log-probability file), and `servetune bench` end to end.
if(TARGET servetune_datasets)
  servetune_test(test_datasets LABEL unit
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_datasets.cpp ${CMAKE_CURRENT_LIST_DIR}/test_datasets_sharegpt.cpp
      ${CMAKE_CURRENT_LIST_DIR}/test_datasets_sessions.cpp ${CMAKE_CURRENT_LIST_DIR}/test_datasets_length_dist.cpp
    LIBS servetune_datasets servetune_formats)
endif()
if(TARGET servetune_loadgen)
  servetune_test(test_loadgen LABEL unit
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_loadgen_metrics.cpp ${CMAKE_CURRENT_LIST_DIR}/test_loadgen_sse.cpp
      ${CMAKE_CURRENT_LIST_DIR}/test_loadgen_server_metrics.cpp ${CMAKE_CURRENT_LIST_DIR}/test_loadgen_backends.cpp
      ${CMAKE_CURRENT_LIST_DIR}/test_loadgen_sessions.cpp ${CMAKE_CURRENT_LIST_DIR}/test_loadgen_agent_sessions.cpp
    LIBS servetune_loadgen_core servetune_core)
  servetune_test(test_loadgen_http LABEL unit
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_loadgen_http.cpp
    LIBS servetune_loadgen_core servetune_core)
  target_compile_definitions(test_loadgen_http PRIVATE SERVETUNE_MOCK_SERVER="$<TARGET_FILE:servetune_mock_openai>")
  add_dependencies(test_loadgen_http servetune_mock_openai)
  servetune_test(test_loadgen_inprocess LABEL unit
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_loadgen_inprocess.cpp
    LIBS servetune_loadgen)
  servetune_test(test_loadgen_perplexity_server LABEL unit
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_loadgen_perplexity_server.cpp
    LIBS servetune_loadgen)
  if(TARGET servetune)
    servetune_test(test_loadgen_cli LABEL unit
      SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_loadgen_cli.cpp
      LIBS nlohmann_json::nlohmann_json servetune_core)
    target_compile_definitions(test_loadgen_cli PRIVATE SERVETUNE_BIN="$<TARGET_FILE:servetune>"
                               SERVETUNE_MOCK_SERVER="$<TARGET_FILE:servetune_mock_openai>")
    add_dependencies(test_loadgen_cli servetune servetune_mock_openai)
  endif()
endif()
