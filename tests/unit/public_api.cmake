# The public API is the only door (cmake/check_public_api.cmake): no engine-internal include from the engine's users,
# nothing but servetune/ headers under engine/include/; and the check's self-test on a tree with known violations.
add_test(NAME public_api_includes
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -P ${PROJECT_SOURCE_DIR}/cmake/check_public_api.cmake)
add_test(NAME public_api_check_self_test
  COMMAND ${CMAKE_COMMAND} -DSELF_TEST=ON -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}
          -P ${PROJECT_SOURCE_DIR}/cmake/check_public_api.cmake)
set_tests_properties(public_api_includes public_api_check_self_test PROPERTIES LABELS unit)
