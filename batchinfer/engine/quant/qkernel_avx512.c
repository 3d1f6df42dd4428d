// The AVX-512 VNNI path's ten block types (gemm_avx512.h), compiled beside the rest (qkernel.c); and the path
// VNNI_MUL, the same but for K-quant scales taken by vpmulld (scaled_dot): Q4_K and Q5_K its own, the rest shared.
#include "gemm_avx512.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")

#define VNNI_TYPE(T, MUL, NAME) \
    static void NAME(const act_t *A, int64_t M, const uint8_t *w, int64_t N, float *y, int64_t ldy, int threads) { \
        const int64_t panels = (N + PANEL - 1) / PANEL, decoded = (A->K / QT[T].sb) * decoded_vecs(T) * 64;          \
        const int64_t per = panels_per_range(decoded, panels, threads), ranges = (panels + per - 1) / per;       \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                     \
        for (int64_t r = 0; r < ranges; r++)                                                                  \
            panels_vnni(T, MUL, A, M, w, r * per, (r + 1) * per < panels ? (r + 1) * per : panels, N, y, ldy); \
    }
VNNI_TYPE(Q4_0, 0, gemm_vnni_Q4_0) VNNI_TYPE(Q4_1, 0, gemm_vnni_Q4_1) VNNI_TYPE(Q5_0, 0, gemm_vnni_Q5_0)
VNNI_TYPE(Q5_1, 0, gemm_vnni_Q5_1) VNNI_TYPE(Q8_0, 0, gemm_vnni_Q8_0) VNNI_TYPE(Q2_K, 0, gemm_vnni_Q2_K)
VNNI_TYPE(Q3_K, 0, gemm_vnni_Q3_K) VNNI_TYPE(Q4_K, 0, gemm_vnni_Q4_K) VNNI_TYPE(Q5_K, 0, gemm_vnni_Q5_K)
VNNI_TYPE(Q6_K, 0, gemm_vnni_Q6_K) VNNI_TYPE(Q4_K, 1, gemm_vnni_mul_Q4_K) VNNI_TYPE(Q5_K, 1, gemm_vnni_mul_Q5_K)

// A path's table on its build bit P (a model's load on an AMD CPU builds VNNI_MUL's alone: each type's code once).
#define VNNI_TABLE(P, Q4K, Q5K) {                                                                                  \
    BUILT_ON(P, Q4_0, gemm_vnni_Q4_0), BUILT_ON(P, Q4_1, gemm_vnni_Q4_1), BUILT_ON(P, Q5_0, gemm_vnni_Q5_0),     \
    BUILT_ON(P, Q5_1, gemm_vnni_Q5_1), BUILT_ON(P, Q8_0, gemm_vnni_Q8_0), BUILT_ON(P, Q2_K, gemm_vnni_Q2_K),     \
    BUILT_ON(P, Q3_K, gemm_vnni_Q3_K), BUILT_ON(P, Q4_K, Q4K), BUILT_ON(P, Q5_K, Q5K),                           \
    BUILT_ON(P, Q6_K, gemm_vnni_Q6_K)                                                                            \
}
const gemm_fn GEMM_VNNI[NTYPES] = VNNI_TABLE(2, gemm_vnni_Q4_K, gemm_vnni_Q5_K);
const gemm_fn GEMM_VNNI_MUL[NTYPES] = VNNI_TABLE(4, gemm_vnni_mul_Q4_K, gemm_vnni_mul_Q5_K);

#pragma GCC pop_options
