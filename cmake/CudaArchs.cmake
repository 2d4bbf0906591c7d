# PAGEDMHA_CUDA_ARCHS -> nvcc code generation options. One option per (virtual arch,
# code) so that CMake's option de-duplication cannot merge them.
include_guard(GLOBAL)

# Sets, in the caller's scope:
#   PAGEDMHA_CUDA_GENCODE       options for the portable kernels (every entry);
#   PAGEDMHA_CUDA_GENCODE_SM90  options for the Hopper kernels (sm_90a; empty without 90a);
#   PAGEDMHA_CUDA_ARCHS_CSV     the entries, comma-separated (read at run time by
#                               src/cuda/common/arch.cu to tell which GPUs can run them).
function(pagedmha_cuda_gencode archs)
  set(gencode "")
  set(gencode_sm90 "")
  if(NOT archs)
    message(FATAL_ERROR "PAGEDMHA_CUDA_ARCHS: expected a list such as 80;89;90a, got an empty list")
  endif()
  foreach(entry IN LISTS archs)
    if(NOT entry MATCHES "^([0-9]+)(a?)(-real|-virtual)?$")
      message(FATAL_ERROR "PAGEDMHA_CUDA_ARCHS: expected entries NN, NN-real, NN-virtual or NNa "
                          "(e.g. 80;89;90a), got '${entry}'")
    endif()
    set(num "${CMAKE_MATCH_1}")
    set(suffix "${CMAKE_MATCH_2}")
    set(kind "${CMAKE_MATCH_3}")
    if(num LESS 80)
      message(FATAL_ERROR "PAGEDMHA_CUDA_ARCHS: the kernels need compute capability 8.0 or newer "
                          "(mma.sync on bf16, cp.async), got '${entry}'")
    endif()
    set(arch ${num}${suffix})
    if(suffix STREQUAL "a" AND kind STREQUAL "-virtual")
      message(FATAL_ERROR "PAGEDMHA_CUDA_ARCHS: '${entry}': arch-specific PTX runs only on "
                          "compute capability ${num}; use ${arch}")
    endif()
    # NNa: SASS only (its PTX would JIT on no other GPU). NN: SASS and PTX, as in CMake.
    if(NOT kind STREQUAL "-virtual")
      list(APPEND gencode --generate-code=arch=compute_${arch},code=sm_${arch})
    endif()
    if(kind STREQUAL "-virtual" OR (kind STREQUAL "" AND suffix STREQUAL ""))
      list(APPEND gencode --generate-code=arch=compute_${arch},code=compute_${arch})
    endif()
    if(arch STREQUAL "90a")
      set(gencode_sm90 --generate-code=arch=compute_90a,code=sm_90a)
    endif()
  endforeach()
  string(REPLACE ";" "," csv "${archs}")
  set(PAGEDMHA_CUDA_GENCODE "${gencode}" PARENT_SCOPE)
  set(PAGEDMHA_CUDA_GENCODE_SM90 "${gencode_sm90}" PARENT_SCOPE)
  set(PAGEDMHA_CUDA_ARCHS_CSV "${csv}" PARENT_SCOPE)
endfunction()
