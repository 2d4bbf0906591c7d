# Reads src/cuda/common/arch.h (plain C++) directly.
target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
