// The AMX path's ten block types (gemm_amx.h), compiled beside the rest (qkernel.c).
#include "gemm_amx.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,amx-tile,amx-int8")

int amx_init(void) { return request_amx(); }

#define AMX_TYPE(T) \
    static void gemm_amx_##T(const act_t *A, int64_t M, const uint8_t *w, int64_t N, float *y, int64_t ldy, int threads) { \
        const int64_t panels = (N + PANEL - 1) / PANEL, nsb = A->K / QT[T].sb;                                            \
        const int64_t bytes = nsb * layout_of(T).record_bytes;                                                            \
        _Pragma("omp parallel num_threads(threads)")                                                                      \
        {                                                                                                                 \
            /* K-quants: two super-blocks' planes and the rows' sums; 32-types: the panel's codes */                       \
            uint8_t *scratch = aligned_alloc(64, (size_t)(QT[T].kquant ? 16384 : A->K * PANEL));                          \
            float *acc = aligned_alloc(64, (size_t)((M + 31) / 32 * 32 * PANEL) * sizeof(float));                         \
            configure_tiles(QT[T].kquant);                                                                      \
            _Pragma("omp for schedule(static)")                                                                           \
            for (int64_t p = 0; p < panels; p++) {                                                                        \
                const int ncols = (int)(N - p * PANEL < PANEL ? N - p * PANEL : PANEL);                                   \
                const uint8_t *panel = w + p * bytes;                                                                     \
                if (QT[T].kquant) {                                                                                       \
                    kquant_panel(T, A, M, panel, scratch, acc, y + p * PANEL, ldy, ncols);                                \
                    continue;                                                                                             \
                }                                                                                                         \
                decode_codes(T, panel, nsb, scratch);                                                                     \
                for (int64_t m = 0; m < M; m += 16)                                                                       \
                    block_rows(T, A, m, (int)(M - m < 16 ? M - m : 16), panel, scratch, y + p * PANEL, ldy, ncols);       \
            }                                                                                                             \
            _tile_release();                                                                                              \
            free(scratch);                                                                                                \
            free(acc);                                                                                                    \
        }                                                                                                                 \
    }
AMX_TYPE(Q4_0) AMX_TYPE(Q4_1) AMX_TYPE(Q5_0) AMX_TYPE(Q5_1) AMX_TYPE(Q8_0)
AMX_TYPE(Q2_K) AMX_TYPE(Q3_K) AMX_TYPE(Q4_K) AMX_TYPE(Q5_K) AMX_TYPE(Q6_K)

const gemm_fn GEMM_AMX[NTYPES] = {
    BUILT_ON(3, Q4_0, gemm_amx_Q4_0), BUILT_ON(3, Q4_1, gemm_amx_Q4_1), BUILT_ON(3, Q5_0, gemm_amx_Q5_0),
    BUILT_ON(3, Q5_1, gemm_amx_Q5_1), BUILT_ON(3, Q8_0, gemm_amx_Q8_0), BUILT_ON(3, Q2_K, gemm_amx_Q2_K),
    BUILT_ON(3, Q3_K, gemm_amx_Q3_K), BUILT_ON(3, Q4_K, gemm_amx_Q4_K), BUILT_ON(3, Q5_K, gemm_amx_Q5_K),
    BUILT_ON(3, Q6_K, gemm_amx_Q6_K)
};

#pragma GCC pop_options
