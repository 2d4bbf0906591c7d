#include "pagedmha/numeric.h"

#include <bit>
#include <cmath>

namespace pagedmha {

uint16_t float_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t float_to_fp16(float x) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(x));  // hardware / libgcc RNE
}

float fp16_to_float(uint16_t bits) { return static_cast<float>(std::bit_cast<_Float16>(bits)); }

uint8_t float_to_fp8_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;  // saturate to the largest finite value
  // Exponent range: normals 2^-6 .. 2^8 with 3 mantissa bits; subnormals step 2^-9.
  int exp;
  std::frexp(a, &exp);  // a = f * 2^exp, f in [0.5, 1)
  int e = exp - 1;      // a in [2^e, 2^(e+1))
  if (e < -6) e = -6;   // subnormal range shares the 2^-9 quantum
  const float quantum = std::ldexp(1.0f, e - 3);
  float q = std::nearbyint(a / quantum) * quantum;  // default rounding mode: nearest even
  if (q >= 448.0f) return sign | 0x7E;
  if (q == 0.0f) return sign;
  int qe;
  float qf = std::frexp(q, &qe);
  int biased = qe - 1 + 7;
  if (biased <= 0) {  // subnormal: value = m * 2^-9
    return sign | static_cast<uint8_t>(std::lround(q / std::ldexp(1.0f, -9)));
  }
  const int mant = static_cast<int>(std::lround((qf * 2.0f - 1.0f) * 8.0f));
  return sign | static_cast<uint8_t>((biased << 3) | mant);
}

float fp8_e4m3_to_float(uint8_t bits) {
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  const int e = (bits >> 3) & 0xF;
  const int m = bits & 0x7;
  if (e == 0xF && m == 0x7) return std::nanf("");
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(1.0f + m / 8.0f, e - 7);
}

}  // namespace pagedmha
