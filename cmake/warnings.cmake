# Warning flags applied to ferry's own targets through ferry_set_warnings(target).
function(ferry_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow=local -Wnon-virtual-dtor -Wno-unused-parameter
    # Argument structs are filled with designated initializers that omit optional views on purpose.
    -Wno-missing-field-initializers>)
  if(FERRY_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()
