// <immintrin.h> for the kernels that use AVX-512 (kernel_util.h, vec16.h), included through here
// so that its first inclusion is the guarded one: GCC 12's AVX-512 headers seed results with
// _mm512_undefined_ps(), which -Wmaybe-uninitialized reports at every inlined use (GCC bug 105593);
// the warning is silenced for the header only.
#pragma once

#ifdef __AVX512F__
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
