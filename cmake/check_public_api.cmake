# Keeps the public API (engine/include/servetune/*.h) the only door into the engine. Run by ctest (tests/unit/
# public_api.cmake):  cmake -DSOURCE_DIR=<repo> -P check_public_api.cmake   fails listing file:line for
#   - a quoted #include of an engine-internal header (any folder under engine/ but include/ and server/, also when
#     spelled through engine/ or ../) from cli/ tuner/ report/ importers/ loadgen/ datasets/ engine/server/;
#   - a server/ header included from outside engine/server/ and cli/ (the server is a client of the engine, not an API);
#   - any quoted #include under engine/include/ that is not servetune/...
# With -DSELF_TEST=ON -DWORK_DIR=<dir> it instead builds a small tree with known violations in WORK_DIR and fails
# unless exactly those are reported, so a check that stopped finding anything would not pass unnoticed.
cmake_minimum_required(VERSION 3.25)

set(kApiUserDirs cli tuner report importers loadgen datasets engine/server)

set(kInternal "engine-internal, use the public servetune/ headers")
set(kPublicOnly "a public header includes only servetune/ headers")
set(kServerOnly "the server's own headers are for engine/server/ and cli/ only")

# Appends "path:line: #include "header" (why)" to `out_var` for every violation in the file `rel` (relative to `root`).
function(check_file root rel internal_modules out_var)
  file(READ "${root}/${rel}" text)
  # One list element per line: characters CMake's list syntax would interpret are replaced first.
  string(REPLACE "\\" "/" text "${text}")
  string(REPLACE ";" "," text "${text}")
  string(REPLACE "[" "(" text "${text}")
  string(REPLACE "]" ")" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(found ${${out_var}})
  set(line_no 0)
  foreach(line IN LISTS lines)
    math(EXPR line_no "${line_no} + 1")
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"")
      continue()
    endif()
    set(header "${CMAKE_MATCH_1}")
    # The path as the include directories spell it: ../ resolved from the file's folder, engine/ and include/ dropped.
    set(path "${header}")
    if(path MATCHES "(^|/)\\.\\./")
      get_filename_component(file_dir "${root}/${rel}" DIRECTORY)
      get_filename_component(path "${file_dir}/${path}" ABSOLUTE)
      file(RELATIVE_PATH path "${root}" "${path}")
    endif()
    string(REGEX REPLACE "^engine/" "" path "${path}")
    string(REGEX REPLACE "^include/" "" path "${path}")
    string(REGEX REPLACE "/.*" "" top "${path}")
    set(why "")
    if(rel MATCHES "^engine/include/")
      if(NOT header MATCHES "^servetune/[^/.][^/]*$")
        set(why "${kPublicOnly}")
      endif()
    elseif(top IN_LIST internal_modules)
      set(why "${kInternal}")
    elseif(top STREQUAL "server" AND NOT rel MATCHES "^(engine/server|cli)/")
      set(why "${kServerOnly}")
    endif()
    if(why)
      list(APPEND found "${rel}:${line_no}: #include \"${header}\" (${why})")
    endif()
  endforeach()
  set(${out_var} ${found} PARENT_SCOPE)
endfunction()

# Sets `out_var` to the violations under `root`.
function(public_api_violations root out_var)
  file(GLOB engine_entries RELATIVE "${root}/engine" "${root}/engine/*")
  set(internal_modules "")
  foreach(entry IN LISTS engine_entries)
    if(IS_DIRECTORY "${root}/engine/${entry}" AND NOT entry MATCHES "^(include|server)$")
      list(APPEND internal_modules "${entry}")
    endif()
  endforeach()
  set(files "")
  foreach(dir IN LISTS kApiUserDirs ITEMS engine/include)
    file(GLOB_RECURSE dir_files RELATIVE "${root}" "${root}/${dir}/*.h" "${root}/${dir}/*.hpp" "${root}/${dir}/*.cpp"
         "${root}/${dir}/*.cc" "${root}/${dir}/*.cu" "${root}/${dir}/*.inc")
    list(APPEND files ${dir_files})
  endforeach()
  list(SORT files)
  set(found "")
  foreach(rel IN LISTS files)
    check_file("${root}" "${rel}" "${internal_modules}" found)
  endforeach()
  set(${out_var} ${found} PARENT_SCOPE)
endfunction()

if(SELF_TEST)
  if(NOT WORK_DIR)
    message(FATAL_ERROR "check_public_api.cmake: SELF_TEST needs -DWORK_DIR=<scratch folder>")
  endif()
  set(root "${WORK_DIR}/public_api_fixture")
  file(REMOVE_RECURSE "${root}")
  file(WRITE "${root}/engine/core/error.h" "#pragma once\n")
  file(WRITE "${root}/engine/runtime/sampler.h" "#pragma once\n")
  file(WRITE "${root}/engine/include/servetune/ok.h" "#include <vector>\n#include \"servetune/error.h\"\n")
  file(WRITE "${root}/engine/include/servetune/leaky.h" "#pragma once\n// [ ; odd\n\n#include \"runtime/sampler.h\"\n")
  file(WRITE "${root}/engine/server/server.cpp" "#include \"server/server.h\"\n#include \"core/error.h\"\n")
  file(WRITE "${root}/cli/cmd_serve.cpp" "#include \"server/server.h\"\n#include \"servetune/engine.h\"\n")
  file(WRITE "${root}/tuner/space.cpp" "#include \"tuner/space.h\"\n\n  #  include \"runtime/sampler.h\"\n"
       "#include \"engine/core/error.h\"\n#include \"server/server.h\"\n")
  file(WRITE "${root}/loadgen/mock/mock.cpp"
       "#include \"../../engine/core/error.h\"\n#include \"../x.h\"\n#include \"engine/include/servetune/ok.h\"\n")
  file(WRITE "${root}/cli/cmd_bench.cpp" "#include \"core/error.h\"\n")
  set(expected
    "cli/cmd_bench.cpp:1: #include \"core/error.h\" (${kInternal})"
    "engine/include/servetune/leaky.h:4: #include \"runtime/sampler.h\" (${kPublicOnly})"
    "engine/server/server.cpp:2: #include \"core/error.h\" (${kInternal})"
    "loadgen/mock/mock.cpp:1: #include \"../../engine/core/error.h\" (${kInternal})"
    "tuner/space.cpp:3: #include \"runtime/sampler.h\" (${kInternal})"
    "tuner/space.cpp:4: #include \"engine/core/error.h\" (${kInternal})"
    "tuner/space.cpp:5: #include \"server/server.h\" (${kServerOnly})")
  public_api_violations("${root}" found)
  string(JOIN "\n" got_text ${found})
  string(JOIN "\n" want_text ${expected})
  if(NOT got_text STREQUAL want_text)
    message(NOTICE "expected:\n${want_text}\ngot:\n${got_text}")
    message(FATAL_ERROR "check_public_api.cmake self-test: other violations than the expected ones")
  endif()
  message(STATUS "check_public_api.cmake self-test: exactly the known violations are reported")
  return()
endif()

if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_public_api.cmake: give -DSOURCE_DIR=<repository root>")
endif()
public_api_violations("${SOURCE_DIR}" found)
if(found)
  list(LENGTH found count)
  string(JOIN "\n" report ${found})
  message(NOTICE "${report}")
  message(FATAL_ERROR "${count} include(s) above go around the public API (engine/include/servetune/)")
endif()
message(STATUS "public API check: no engine-internal includes outside the engine")
