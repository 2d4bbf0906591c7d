// Host conversions between fp32 and the 16- and 8-bit storage formats.
#pragma once

#include <cstdint>

namespace pagedmha {

/// fp32 -> bf16 bits, round to nearest even; NaN stays NaN.
uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t bits);
/// fp32 -> IEEE binary16 bits, round to nearest even, overflow to inf.
uint16_t float_to_fp16(float x);
float fp16_to_float(uint16_t bits);
/// fp32 -> fp8 E4M3FN bits: round to nearest even, saturating to +-448; NaN -> 0x7F.
uint8_t float_to_fp8_e4m3(float x);
float fp8_e4m3_to_float(uint8_t bits);

}  // namespace pagedmha
