# cmake -P tests/cmake/cuda_archs_test.cmake: checks cmake/CudaArchs.cmake, the mapping
# PAGEDMHA_CUDA_ARCHS -> nvcc options (ctest: cmake_cuda_archs). With -DARCHS=<list> it
# only runs the mapping (the child processes that must fail).
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/CudaArchs.cmake)
if(DEFINED ARCHS)
  pagedmha_cuda_gencode("${ARCHS}")
  return()
endif()

function(expect archs gencode sm90)
  pagedmha_cuda_gencode("${archs}")
  if(NOT "${PAGEDMHA_CUDA_GENCODE}" STREQUAL "${gencode}" OR NOT "${PAGEDMHA_CUDA_GENCODE_SM90}" STREQUAL "${sm90}")
    message(FATAL_ERROR "PAGEDMHA_CUDA_ARCHS=${archs}: got '${PAGEDMHA_CUDA_GENCODE}' / "
                        "'${PAGEDMHA_CUDA_GENCODE_SM90}', expected '${gencode}' / '${sm90}'")
  endif()
endfunction()

set(g --generate-code=arch=compute_)
expect("80;89;90a"
       "${g}80,code=sm_80;${g}80,code=compute_80;${g}89,code=sm_89;${g}89,code=compute_89;${g}90a,code=sm_90a"
       "${g}90a,code=sm_90a")
expect("90a" "${g}90a,code=sm_90a" "${g}90a,code=sm_90a")
expect("80-real;89-virtual" "${g}80,code=sm_80;${g}89,code=compute_89" "")
pagedmha_cuda_gencode("80;89;90a")
if(NOT PAGEDMHA_CUDA_ARCHS_CSV STREQUAL "80,89,90a")
  message(FATAL_ERROR "PAGEDMHA_CUDA_ARCHS_CSV: got '${PAGEDMHA_CUDA_ARCHS_CSV}', expected 80,89,90a")
endif()

# Rejected with a message naming the entry: too old, malformed, arch-specific PTX, empty.
foreach(bad IN ITEMS "75" "80;sm_89" "90a-virtual" "89x" "")
  execute_process(COMMAND ${CMAKE_COMMAND} "-DARCHS=${bad}" -P ${CMAKE_CURRENT_LIST_FILE}
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(rc EQUAL 0 OR NOT err MATCHES "PAGEDMHA_CUDA_ARCHS: expected|PAGEDMHA_CUDA_ARCHS: the kernels|PAGEDMHA_CUDA_ARCHS: '")
    message(FATAL_ERROR "PAGEDMHA_CUDA_ARCHS=${bad}: expected a configure error, got exit ${rc}: ${err}")
  endif()
endforeach()
message(STATUS "cuda_archs_test: passed")
