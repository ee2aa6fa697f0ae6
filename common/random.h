// The project's one pseudo-random generator: splitmix64 (Steele, Lea and
// Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014).
// Deterministic and tiny; used for synthetic gradients, model initialization,
// batch sampling and bench inputs, never for anything secret (tokens come
// from the OS, common/token.h).
#ifndef ZENFLOW_COMMON_RANDOM_H_
#define ZENFLOW_COMMON_RANDOM_H_

#include <cstdint>

namespace zenflow {

// splitmix64's increment (2^64 / golden ratio, odd).
inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ull;

// splitmix64's output function: a bijective mix of 64 bits.
inline constexpr uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Advances *state by one step and returns the step's output.
inline uint64_t NextRandom(uint64_t* state) {
  *state += kSplitMix64Gamma;
  return Mix64(*state);
}

// The output a generator seeded with `x` gives first: a stateless hash.
inline constexpr uint64_t HashRandom(uint64_t x) { return Mix64(x + kSplitMix64Gamma); }

// Uniform doubles from the top 53 bits: in [0, 1), and in (0, 1].
inline double UnitInterval(uint64_t bits) {
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}
inline double UnitIntervalOpenZero(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

}  // namespace zenflow

#endif  // ZENFLOW_COMMON_RANDOM_H_
