# Reads src/cuda/common/arch.h, src/cuda/decode/policy.h, src/cuda/prefill_sm90/policy.h
# and src/cuda/hopper/kv_boxes.h
# (plain C++) directly.
target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
