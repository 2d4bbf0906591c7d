# NCCL for `pagedmha replay --gpus N` (the tool only; the library never links it).
# PAGEDMHA_WITH_NCCL: AUTO (default) uses NCCL when found, ON requires it, OFF never.
# Searched: PAGEDMHA_NCCL_DIR, the nvidia-nccl-cu* pip package of the Python that CMake
# finds (site-packages/nvidia/nccl/{include,lib}, which may hold only libnccl.so.2), the
# CUDA toolkit and the system folders (/usr/local/{include,lib} among them).
# Defines the imported target pagedmha::nccl and sets PAGEDMHA_NCCL_FOUND.
include_guard(GLOBAL)

function(pagedmha_find_nccl)
  set(PAGEDMHA_NCCL_FOUND OFF PARENT_SCOPE)
  if(NOT PAGEDMHA_WITH_CUDA OR PAGEDMHA_WITH_NCCL STREQUAL "OFF")
    message(STATUS "pagedmha: NCCL off (replay --gpus on GPUs unavailable)")
    return()
  endif()
  set(hints "")
  if(PAGEDMHA_NCCL_DIR)
    list(APPEND hints ${PAGEDMHA_NCCL_DIR})
  endif()
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    # nvidia.nccl is a namespace package: its folder is the first entry of __path__.
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _pip_nccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
    if(_rc EQUAL 0 AND EXISTS "${_pip_nccl}")
      list(APPEND hints ${_pip_nccl})
    endif()
  endif()
  find_path(PAGEDMHA_NCCL_INCLUDE_DIR nccl.h HINTS ${hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  # NAMES_PER_DIR: the first folder holding either name wins, so the library comes from
  # where the header came from (the pip package before a system copy).
  find_library(PAGEDMHA_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${hints} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  if(PAGEDMHA_NCCL_INCLUDE_DIR AND PAGEDMHA_NCCL_LIBRARY)
    if(NOT TARGET pagedmha::nccl)
      add_library(pagedmha::nccl SHARED IMPORTED GLOBAL)
      set_target_properties(pagedmha::nccl PROPERTIES IMPORTED_LOCATION ${PAGEDMHA_NCCL_LIBRARY}
                            INTERFACE_INCLUDE_DIRECTORIES ${PAGEDMHA_NCCL_INCLUDE_DIR})
    endif()
    set(PAGEDMHA_NCCL_FOUND ON PARENT_SCOPE)
    message(STATUS "pagedmha: NCCL ${PAGEDMHA_NCCL_LIBRARY} (headers ${PAGEDMHA_NCCL_INCLUDE_DIR})")
  elseif(PAGEDMHA_WITH_NCCL STREQUAL "ON")
    message(FATAL_ERROR "pagedmha: PAGEDMHA_WITH_NCCL=ON but NCCL was not found (nccl.h: "
                        "${PAGEDMHA_NCCL_INCLUDE_DIR}, library: ${PAGEDMHA_NCCL_LIBRARY}); set PAGEDMHA_NCCL_DIR "
                        "or pip-install nvidia-nccl-cu13")
  else()
    message(STATUS "pagedmha: NCCL not found (replay --gpus on GPUs unavailable; PAGEDMHA_NCCL_DIR to point at it)")
  endif()
endfunction()
