# Reads src/cuda/common/arch.h and src/cuda/decode/policy.h (plain C++) directly.
target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
