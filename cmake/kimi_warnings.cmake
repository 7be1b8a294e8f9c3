# Warnings for project code only; generated protobuf code and third-party headers are not held to them.
# -Wno-restrict: GCC 12 at -O3 reports false positives inside libstdc++'s std::string operator+
# (GCC bug 105329).
function(kimi_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wnon-virtual-dtor -Wimplicit-fallthrough -Wno-restrict>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${KIMI_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${KIMI_WERROR}>>:--Werror=all-warnings -Xcompiler=-Werror>)
endfunction()

# One GoogleTest binary per source folder; ctest sees every TEST through gtest_discover_tests.
function(kimi_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  kimi_warnings(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  set(labels unit)
  if(ARG_LABELS)
    set(labels ${ARG_LABELS})
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 PROPERTIES LABELS "${labels}"
                       ENVIRONMENT "KIMI_SOURCE_DIR=${CMAKE_SOURCE_DIR};KIMI_BUILD_DIR=${CMAKE_BINARY_DIR}")
endfunction()

# A tool refusing a bad command line: `target ARGN...` must print `message` (a regular expression)
# and exit with status 2, the tools' usage-error code (not abort, hang or run anyway).
function(kimi_usage_error_test name target message)
  add_test(NAME ${name} COMMAND sh -c "\"$0\" \"$@\"; echo exit=$?" $<TARGET_FILE:${target}> ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS unit TIMEOUT 30
                       PASS_REGULAR_EXPRESSION "${message}[^\n]*\nexit=2")
endfunction()
