// The exp polynomial the C kernels share (attention's softmax, the norms' SiLU), hashed into each kernel's build
// key (native_build.py), so a change here rebuilds them all.
#pragma once

// Cephes' expf after the clamp and n = floor(x log2(e) + 1/2): r = x - n ln2 in two steps, y = p(r). One definition
// for both widths (P: the intrinsics' prefix), so exp8 and the AVX-512 exp stay the same bits lane by lane.
#define EXP_POLY(P, x, n, y) do {                                              \
    x = P##_fnmadd_ps(n, P##_set1_ps(0.693359375f), x);                        \
    x = P##_fnmadd_ps(n, P##_set1_ps(-2.12194440e-4f), x);                     \
    y = P##_set1_ps(1.9875691500e-4f);                                         \
    y = P##_fmadd_ps(y, x, P##_set1_ps(1.3981999507e-3f));                     \
    y = P##_fmadd_ps(y, x, P##_set1_ps(8.3334519073e-3f));                     \
    y = P##_fmadd_ps(y, x, P##_set1_ps(4.1665795894e-2f));                     \
    y = P##_fmadd_ps(y, x, P##_set1_ps(1.6666665459e-1f));                     \
    y = P##_fmadd_ps(y, x, P##_set1_ps(5.0000001201e-1f));                     \
    y = P##_fmadd_ps(y, P##_mul_ps(x, x), P##_add_ps(x, P##_set1_ps(1.0f)));  \
} while (0)
