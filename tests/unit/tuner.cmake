# Tuner tests: constraint expressions, sweep-file validation, search space and flag rendering, strategies over
# synthetic results, results store / table / check / reports, the measurement against a scripted client, the
# communication cost model, the reading of Slurm's answers. No engine runs here (tests/integration/tuner does).
if(TARGET servetune_tuner)
  servetune_test(test_tuner LABEL unit
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tuner_expr.cpp ${CMAKE_CURRENT_LIST_DIR}/test_tuner_spec.cpp
            ${CMAKE_CURRENT_LIST_DIR}/test_tuner_space.cpp ${CMAKE_CURRENT_LIST_DIR}/test_tuner_strategy.cpp
            ${CMAKE_CURRENT_LIST_DIR}/test_tuner_results.cpp ${CMAKE_CURRENT_LIST_DIR}/test_tuner_report.cpp
            ${CMAKE_CURRENT_LIST_DIR}/test_tuner_import.cpp ${CMAKE_CURRENT_LIST_DIR}/test_tuner_measurement.cpp
            ${CMAKE_CURRENT_LIST_DIR}/test_tuner_process_tree.cpp ${CMAKE_CURRENT_LIST_DIR}/test_tuner_noise.cpp
            ${CMAKE_CURRENT_LIST_DIR}/test_tuner_comm_cost.cpp ${CMAKE_CURRENT_LIST_DIR}/test_tuner_load_search.cpp
            ${CMAKE_CURRENT_LIST_DIR}/test_tuner_slurm.cpp
            ${CMAKE_CURRENT_LIST_DIR}/test_tuner_think_time.cpp
    LIBS servetune_tuner servetune_importers servetune_report servetune_core)
  # The engine settings table through JSON, the CLI flags (cli/engine_flags.cpp), sweep files and reproduce commands.
  servetune_test(test_engine_config LABEL unit
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_engine_config.cpp ${PROJECT_SOURCE_DIR}/cli/engine_flags.cpp
    LIBS servetune_tuner CLI11::CLI11)
endif()
