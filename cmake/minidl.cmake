# Shared compile settings for every minidl target.
add_library(minidl_options INTERFACE)
target_compile_options(minidl_options INTERFACE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
if(MINIDL_WERROR)
  target_compile_options(minidl_options INTERFACE -Werror)
endif()
if(MINIDL_SANITIZE)
  string(REPLACE ";" "," _minidl_san "${MINIDL_SANITIZE}")
  target_compile_options(minidl_options INTERFACE -fsanitize=${_minidl_san} -fno-omit-frame-pointer)
  target_link_options(minidl_options INTERFACE -fsanitize=${_minidl_san})
endif()

# minidl_add_library(<layer> SOURCES ... DEPS ...): one library target per folder, minidl::<layer>.
function(minidl_add_library layer)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(minidl_${layer} ${ARG_SOURCES})
  add_library(minidl::${layer} ALIAS minidl_${layer})
  target_include_directories(minidl_${layer} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> $<INSTALL_INTERFACE:include>)
  target_link_libraries(minidl_${layer} PUBLIC ${ARG_DEPS} PRIVATE minidl_options)
  set_target_properties(minidl_${layer} PROPERTIES OUTPUT_NAME minidl_${layer})
endfunction()
