# The tool's library: replay --gpus through NCCL (skipped when the build has none).
target_link_libraries(${target} PRIVATE pagedmha_tools)
