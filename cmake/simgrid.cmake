# MINIDL_SIMGRID: the examples are built against SimGrid's SMPI instead of OpenMPI, to run on a
# simulated cluster under smpirun (scripts/simulate-cluster). SMPI's MPI is a library that runs
# every rank as a simulated process inside one real process: smpirun loads the program once per
# rank (a private copy of its globals each), so a program is linked as a position-independent
# shared object with an exported main, the way smpicxx builds one.
#
# Defines the target MPI::MPI_CXX (SMPI's headers and libsimgrid) that minidl::parallel links,
# the compile definition MINIDL_SIMGRID on it, and minidl_simgrid_program(target) for each
# program.
find_path(SIMGRID_SMPI_INCLUDE_DIR smpi/mpi.h)
find_library(SIMGRID_LIBRARY simgrid)
find_program(SIMGRID_SMPIRUN smpirun)
if(NOT SIMGRID_SMPI_INCLUDE_DIR OR NOT SIMGRID_LIBRARY OR NOT SIMGRID_SMPIRUN)
  message(FATAL_ERROR "MINIDL_SIMGRID=ON needs SimGrid's SMPI (smpi/mpi.h, libsimgrid, smpirun): "
                      "install libsimgrid-dev (scripts/install-deps)")
endif()
add_library(MPI::MPI_CXX INTERFACE IMPORTED GLOBAL)
target_include_directories(MPI::MPI_CXX INTERFACE ${SIMGRID_SMPI_INCLUDE_DIR}/smpi)
target_link_libraries(MPI::MPI_CXX INTERFACE ${SIMGRID_LIBRARY})
target_compile_definitions(MPI::MPI_CXX INTERFACE MINIDL_SIMGRID=1)
message(STATUS "minidl: building against SimGrid SMPI (${SIMGRID_LIBRARY}); run with smpirun")

# The dynamic loader of this machine's programs: a simulated program started directly (not by
# smpirun) runs cmake/simgrid_entry.cpp's entry point, which says how to run it.
execute_process(COMMAND readelf -p .interp ${CMAKE_COMMAND} OUTPUT_VARIABLE _interp
                ERROR_QUIET RESULT_VARIABLE _interp_rc)
string(REGEX MATCH "/[^ \n]*ld[^ \n]*\.so[^ \n]*" MINIDL_SIMGRID_INTERP "${_interp}")

function(minidl_simgrid_program target)
  # The program's own objects must be PIC too (not PIE): they end in a shared object.
  target_compile_options(${target} PRIVATE -fPIC)
  target_link_options(${target} PRIVATE -shared -Wl,-z,defs)
  if(MINIDL_SIMGRID_INTERP)
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/cmake/simgrid_entry.cpp)
    set_source_files_properties(${PROJECT_SOURCE_DIR}/cmake/simgrid_entry.cpp PROPERTIES
      COMPILE_DEFINITIONS "MINIDL_SIMGRID_INTERP=\"${MINIDL_SIMGRID_INTERP}\"")
    target_link_options(${target} PRIVATE -Wl,-e,minidl_simgrid_entry)
  endif()
endfunction()
