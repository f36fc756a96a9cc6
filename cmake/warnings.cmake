# Warning flags applied to ferry's own targets through ferry_set_warnings(target).
function(ferry_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wnon-virtual-dtor -Wno-unused-parameter
    # Argument structs are filled with designated initializers that omit optional views on purpose.
    -Wno-missing-field-initializers>)
  # -Wshadow=local is GCC's spelling; clang (the fuzzer build) has only the broader -Wshadow.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wshadow=local>)
  endif()
  if(FERRY_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()
