# The prefill suite asks the library which kernel path a device takes
# (src/cuda/common/arch.h, plain C++): the Hopper prefill documents its own fp8 rounding.
target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
