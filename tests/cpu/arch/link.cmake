# Reads src/cuda/common/arch.h, src/cuda/decode/policy.h, src/cuda/prefill_sm90/policy.h
# src/cuda/hopper/kv_boxes.h and src/cuda/hopper/walk_order.h
# (plain C++) directly.
target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
