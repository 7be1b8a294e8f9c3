// Hot loops compiled once per x86-64 instruction-set level (v4: AVX-512, v3: AVX2 + FMA, and the
// baseline), the best chosen at run time; helpers marked KIMI_INLINE are inlined into each clone.
// FMA contraction differs between clones, so results are deterministic for a given machine.
#pragma once

#define KIMI_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define KIMI_INLINE inline __attribute__((always_inline))
