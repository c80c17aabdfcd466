# Shared compile settings for every minidl target. Build-tree only: an installed minidl does not
# impose our warning flags on its users.
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

include(GNUInstallDirs)
# Where `cmake --install` puts the package config; find_package(minidl) looks there.
set(MINIDL_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/minidl)

# minidl_add_library(<layer> SOURCES ... DEPS ...): one library target per folder, minidl::<layer>,
# called from minidl/<layer>/CMakeLists.txt. The target is installed into the export set
# minidlTargets (as minidl::<layer>) together with the folder's headers, under
# include/minidl/<layer>/ as the code includes them.
#
# In the build tree a layer sees only its own headers and those of the targets it links: its
# include root ${PROJECT_BINARY_DIR}/include/<layer> holds nothing but minidl/<layer>, a symbolic
# link to the folder, and reaches users of the target (PUBLIC) through the link dependencies. So
# "#include "minidl/<x>/..."" of a layer the target does not link fails with "No such file".
#
# OP_TABLE: the layer defines ops. Every "MINIDL_OP(name)" at the start of a line of its SOURCES
# enters the layer's op table, generated into the build tree and compiled by this target (so the
# table of a layer refers only to its own ops, and no layer depends on one above it):
# minidl/<layer>/op_table.hpp declares each op object minidl::<layer>::op_<name> (code names an op
# by its object, so a misspelt op is a compile error) and minidl::<layer>::op_table(), the list of
# them all, which op_table.cpp defines.
function(minidl_add_library layer)
  cmake_parse_arguments(ARG "OP_TABLE" "" "SOURCES;DEPS" ${ARGN})
  cmake_path(GET CMAKE_CURRENT_SOURCE_DIR FILENAME _folder)
  if(NOT _folder STREQUAL layer)
    message(FATAL_ERROR "minidl_add_library(${layer}) must be called from minidl/${layer}/, "
                        "not from ${CMAKE_CURRENT_SOURCE_DIR}")
  endif()
  set(_root ${PROJECT_BINARY_DIR}/include/${layer})
  file(MAKE_DIRECTORY ${_root}/minidl)
  file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${_root}/minidl/${layer} SYMBOLIC)
  set(_generated)
  if(ARG_OP_TABLE)
    _minidl_op_table(${layer} _generated ${ARG_SOURCES})
  endif()
  add_library(minidl_${layer} ${ARG_SOURCES} ${_generated})
  add_library(minidl::${layer} ALIAS minidl_${layer})
  target_include_directories(minidl_${layer} PUBLIC
    $<BUILD_INTERFACE:${_root}> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  if(ARG_OP_TABLE)
    # The generated header has an include root of its own, also seen only through this target.
    target_include_directories(minidl_${layer} PUBLIC
      $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/generated/${layer}>)
    install(FILES ${PROJECT_BINARY_DIR}/generated/${layer}/minidl/${layer}/op_table.hpp
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/minidl/${layer})
  endif()
  target_link_libraries(minidl_${layer} PUBLIC ${ARG_DEPS} PRIVATE $<BUILD_INTERFACE:minidl_options>)
  set_target_properties(minidl_${layer} PROPERTIES OUTPUT_NAME minidl_${layer} EXPORT_NAME ${layer})
  if(MINIDL_SANITIZE)
    # Instrumented static libraries need the sanitizer runtimes in the user's link too.
    target_link_options(minidl_${layer} INTERFACE $<INSTALL_INTERFACE:-fsanitize=${_minidl_san}>)
  endif()
  install(TARGETS minidl_${layer} EXPORT minidlTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  set(_exclude)
  if(NOT MINIDL_WITH_ONEDNN)
    set(_exclude PATTERN onednn EXCLUDE)  # those headers include oneDNN's
  endif()
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/minidl/${layer}
          FILES_MATCHING PATTERN "*.hpp" ${_exclude})
endfunction()

# Writes the op table of <layer> (see OP_TABLE above) from the MINIDL_OP lines of the given
# sources and sets out_var to the generated .cpp. A source whose MINIDL_OP lines change re-runs
# CMake, so the table never misses an op.
function(_minidl_op_table layer out_var)
  set(_names)
  foreach(_f IN LISTS ARGN)
    cmake_path(ABSOLUTE_PATH _f BASE_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_f})
    file(STRINGS ${_f} _lines REGEX "^MINIDL_OP\\([a-z0-9_]+\\)")
    foreach(_l IN LISTS _lines)
      string(REGEX REPLACE "^MINIDL_OP\\(([a-z0-9_]+)\\).*" "\\1" _name "${_l}")
      list(APPEND _names ${_name})
    endforeach()
  endforeach()
  if(NOT _names)
    message(FATAL_ERROR "minidl_add_library(${layer} OP_TABLE): no MINIDL_OP(name) line in its sources")
  endif()
  list(SORT _names)
  set(_decls "")
  set(_entries "")
  foreach(_name IN LISTS _names)
    string(APPEND _decls "extern const ir::OpDef op_${_name};\n")
    string(APPEND _entries "      &op_${_name},\n")
  endforeach()
  set(_header ${PROJECT_BINARY_DIR}/generated/${layer}/minidl/${layer}/op_table.hpp)
  set(_table ${CMAKE_CURRENT_BINARY_DIR}/op_table.cpp)
  file(CONFIGURE OUTPUT ${_header} CONTENT
"// Generated by cmake/minidl.cmake from the MINIDL_OP lines under minidl/${layer}/. Do not edit.
#pragma once

#include <span>

#include \"minidl/ir/op_def.hpp\"

namespace minidl::${layer} {

/// Every op defined under minidl/${layer}/, by name.
std::span<const ir::OpDef* const> op_table();

${_decls}
}  // namespace minidl::${layer}
")
  file(CONFIGURE OUTPUT ${_table} CONTENT
"// Generated by cmake/minidl.cmake from the MINIDL_OP lines under minidl/${layer}/. Do not edit.
#include \"minidl/${layer}/op_table.hpp\"

namespace minidl::${layer} {

std::span<const ir::OpDef* const> op_table() {
  static const ir::OpDef* const kOps[] = {
${_entries}  };
  return kOps;
}

}  // namespace minidl::${layer}
")
  set(${out_var} ${_table} PARENT_SCOPE)
endfunction()

# The package: minidlTargets.cmake (the exported targets, namespace minidl::), minidlConfig.cmake
# (finds what the targets link: static libraries carry their dependencies to the user's link) and
# minidlConfigVersion.cmake. Called once, after every library target exists.
function(minidl_install_package)
  include(CMakePackageConfigHelpers)
  install(EXPORT minidlTargets NAMESPACE minidl:: FILE minidlTargets.cmake
          DESTINATION ${MINIDL_INSTALL_CMAKEDIR})
  configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/minidlConfig.cmake.in
                                ${PROJECT_BINARY_DIR}/minidlConfig.cmake
                                INSTALL_DESTINATION ${MINIDL_INSTALL_CMAKEDIR})
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/minidlConfigVersion.cmake
                                   COMPATIBILITY SameMinorVersion)
  install(FILES ${PROJECT_BINARY_DIR}/minidlConfig.cmake
                ${PROJECT_BINARY_DIR}/minidlConfigVersion.cmake
          DESTINATION ${MINIDL_INSTALL_CMAKEDIR})
endfunction()
