# Server tests: request parsing / validation / error mapping, response and metrics rendering, and the HTTP layer
# in-process on stories260K over loopback (raw sockets).
if(TARGET servetune_server)
  servetune_test(test_server LABEL unit
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_server_protocol.cpp ${CMAKE_CURRENT_LIST_DIR}/test_server_http.cpp
    LIBS servetune_server servetune_formats)
endif()
