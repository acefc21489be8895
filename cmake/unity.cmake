# Unity builds for the targets whose time goes to parsing and instantiating the same headers (nlohmann/json, CLI11,
# GoogleTest) in every file: the command line, tuner, reports, importers, load generator, datasets, server and tests.
# The engine's kernels are never combined (per-file ISA flags, and their time is their own code). CI's presets turn it
# on (clean builds); the default build keeps one object per file for quick incremental rebuilds.
option(SERVETUNE_UNITY_BUILD "Compile the header-heavy targets as unity builds (CI presets)" OFF)
function(servetune_unity_build target)
  if(SERVETUNE_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()
