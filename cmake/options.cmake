# Every ferry build option, with its help text, in one place.
set(FERRY_CUDA "AUTO" CACHE STRING "Build CUDA kernels: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE FERRY_CUDA PROPERTY STRINGS AUTO ON OFF)
option(FERRY_WERROR "Treat compiler warnings as errors" OFF)
set(FERRY_SANITIZE "" CACHE STRING "Comma-separated sanitizers: address,undefined or thread")
option(FERRY_BUILD_TESTS "Build the GoogleTest suites" ON)
option(FERRY_BUILD_BENCH "Build the Google Benchmark programs" ON)
option(FERRY_BUILD_FUZZERS "Build libFuzzer targets (needs clang)" OFF)
option(FERRY_NATIVE "Compile host code with -march=native (never in CI)" OFF)

if(FERRY_SANITIZE)
  string(REPLACE "," ";" _san_list "${FERRY_SANITIZE}")
  foreach(_s IN LISTS _san_list)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_s}>)
    add_link_options(-fsanitize=${_s})
  endforeach()
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
endif()
