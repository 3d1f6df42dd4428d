// y[M, N] = x[M, K] @ W[N, K]^T with W in GGUF's Q4_1 or Q8_0 blocks (32 weights per block along K),
// repacked in panels of 16 output channels (layers/quant_linear.py describes the layout).
//
// Each panel is decoded to fp32 once per call (exactly as gguf's dequantize does: d * q + m, a multiply then
// an add, so the weights equal the de-quantized checkpoint bit for bit), then every row runs a 6x16 fp32
// micro-kernel over it. Every output element is one fused multiply-add chain over k = 0..K-1 in order, the
// same for every row count M and every row tile: a row's result never depends on its batch.
// At M <= SMALL_M (decode steps) the panel is decoded in registers inside a 4x16 micro-kernel instead, one
// k at a time, with the same decode arithmetic and the same chain per output: no scratch written and read
// back (a panel is 36-98 KB, past L1), and the results are bitwise those of the scratch path.
#include <immintrin.h>
#include <stdint.h>
#include <omp.h>

#define PANEL 16
#define BLOCK 32
#define ROWS 6
#define SMALL_M 8
#define FUSED_ROWS 4

// One k of the FMA chain for R rows: every output is acc += x[r][k] * w(k), k in order, whatever the path.
static inline __attribute__((always_inline)) void fma_rows(const int R, const float *x, int64_t K, int64_t k,
                                                           __m256 w0, __m256 w1, __m256 acc[][2]) {
    for (int r = 0; r < R; r++) {
        const __m256 xb = _mm256_broadcast_ss(x + r * K + k);
        acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
    }
}

static inline __attribute__((always_inline)) void store_rows(const int R, __m256 acc[][2], float *y, int64_t N) {
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(y + r * N, acc[r][0]);
        _mm256_storeu_ps(y + r * N + 8, acc[r][1]);
    }
}

static inline __attribute__((always_inline)) void micro(const int R, const float *x, int64_t K,
                                                        const float *wp, float *y, int64_t N) {
    __m256 acc[ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        fma_rows(R, x, K, k, _mm256_load_ps(wp + k * PANEL), _mm256_load_ps(wp + k * PANEL + 8), acc);
    }
    store_rows(R, acc, y, N);
}

static void rows(const float *x, int64_t M, int64_t K, const float *wp, float *y, int64_t N) {
    int64_t m = 0;
    for (; m + ROWS <= M; m += ROWS) micro(ROWS, x + m * K, K, wp, y + m * N, N);
    switch (M - m) {  // the tail: the same chain per element, fewer rows at once
        case 5: micro(5, x + m * K, K, wp, y + m * N, N); break;
        case 4: micro(4, x + m * K, K, wp, y + m * N, N); break;
        case 3: micro(3, x + m * K, K, wp, y + m * N, N); break;
        case 2: micro(2, x + m * K, K, wp, y + m * N, N); break;
        case 1: micro(1, x + m * K, K, wp, y + m * N, N); break;
        default: break;
    }
}

// qs: [N/16, K, 8] bytes, byte j of row k = q[col j] | q[col j + 8] << 4; d, m: [N/16, K/32, 16] fp16.
static void decode_q4_1(const uint8_t *qs, const uint16_t *d, const uint16_t *mn, int64_t K, float *wp) {
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int64_t b = 0; b < K / BLOCK; b++) {
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * PANEL)));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * PANEL + 8)));
        const __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + b * PANEL)));
        const __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + b * PANEL + 8)));
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++) {
            const __m128i v = _mm_loadl_epi64((const __m128i *)(qs + k * 8));
            const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
            const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
            const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
            _mm256_store_ps(wp + k * PANEL, _mm256_add_ps(_mm256_mul_ps(d0, q0), m0));
            _mm256_store_ps(wp + k * PANEL + 8, _mm256_add_ps(_mm256_mul_ps(d1, q1), m1));
        }
    }
}

// qs: [N/16, K, 16] int8; d: [N/16, K/32, 16] fp16.
static void decode_q8_0(const int8_t *qs, const uint16_t *d, int64_t K, float *wp) {
    for (int64_t b = 0; b < K / BLOCK; b++) {
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * PANEL)));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * PANEL + 8)));
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(qs + k * 16));
            const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
            const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
            _mm256_store_ps(wp + k * PANEL, _mm256_mul_ps(d0, q0));
            _mm256_store_ps(wp + k * PANEL + 8, _mm256_mul_ps(d1, q1));
        }
    }
}

// The micro-kernel with the panel decoded in registers: w(k) = d * q + m for 16 channels, then the same FMAs.
static inline __attribute__((always_inline)) void fused_q4_1(const int R, const float *x, int64_t K,
                                                             const uint8_t *qs, const uint16_t *d,
                                                             const uint16_t *mn, float *y, int64_t N) {
    const __m128i low = _mm_set1_epi8(0x0F);
    __m256 acc[FUSED_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / BLOCK; b++) {
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * PANEL)));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * PANEL + 8)));
        const __m256 m0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + b * PANEL)));
        const __m256 m1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + b * PANEL + 8)));
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++) {
            const __m128i v = _mm_loadl_epi64((const __m128i *)(qs + k * 8));
            const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
            const __m256 w0 = _mm256_add_ps(_mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo))), m0);
            const __m256 w1 = _mm256_add_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi))), m1);
            fma_rows(R, x, K, k, w0, w1, acc);
        }
    }
    store_rows(R, acc, y, N);
}

static inline __attribute__((always_inline)) void fused_q8_0(const int R, const float *x, int64_t K,
                                                             const int8_t *qs, const uint16_t *d, float *y,
                                                             int64_t N) {
    __m256 acc[FUSED_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / BLOCK; b++) {
        const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * PANEL)));
        const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * PANEL + 8)));
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(qs + k * 16));
            const __m256 w0 = _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
            const __m256 w1 = _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))));
            fma_rows(R, x, K, k, w0, w1, acc);
        }
    }
    store_rows(R, acc, y, N);
}

// Row tiles of up to FUSED_ROWS (M <= SMALL_M: at most two tiles, so a panel is decoded at most twice).
static void fused_rows_q4_1(const float *x, int64_t M, int64_t K, const uint8_t *qs, const uint16_t *d,
                            const uint16_t *mn, float *y, int64_t N) {
    for (int64_t m = 0; m < M; m += FUSED_ROWS) {
        switch (M - m < FUSED_ROWS ? M - m : FUSED_ROWS) {
            case 4: fused_q4_1(4, x + m * K, K, qs, d, mn, y + m * N, N); break;
            case 3: fused_q4_1(3, x + m * K, K, qs, d, mn, y + m * N, N); break;
            case 2: fused_q4_1(2, x + m * K, K, qs, d, mn, y + m * N, N); break;
            default: fused_q4_1(1, x + m * K, K, qs, d, mn, y + m * N, N); break;
        }
    }
}

static void fused_rows_q8_0(const float *x, int64_t M, int64_t K, const int8_t *qs, const uint16_t *d, float *y,
                            int64_t N) {
    for (int64_t m = 0; m < M; m += FUSED_ROWS) {
        switch (M - m < FUSED_ROWS ? M - m : FUSED_ROWS) {
            case 4: fused_q8_0(4, x + m * K, K, qs, d, y + m * N, N); break;
            case 3: fused_q8_0(3, x + m * K, K, qs, d, y + m * N, N); break;
            case 2: fused_q8_0(2, x + m * K, K, qs, d, y + m * N, N); break;
            default: fused_q8_0(1, x + m * K, K, qs, d, y + m * N, N); break;
        }
    }
}

// Panels are split among threads; each element's arithmetic is the same whoever computes it.
// scratch: threads * K * 16 floats, 32-byte aligned (one decoded panel per thread).
void q4_1_linear(const float *x, int64_t M, int64_t K, const uint8_t *qs, const uint16_t *d, const uint16_t *mn,
                 int64_t N, float *y, float *scratch, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < N / PANEL; p++) {
        if (M <= SMALL_M) {
            fused_rows_q4_1(x, M, K, qs + p * K * 8, d + p * (K / BLOCK) * PANEL, mn + p * (K / BLOCK) * PANEL,
                            y + p * PANEL, N);
            continue;
        }
        float *wp = scratch + (int64_t)omp_get_thread_num() * K * PANEL;
        decode_q4_1(qs + p * K * 8, d + p * (K / BLOCK) * PANEL, mn + p * (K / BLOCK) * PANEL, K, wp);
        rows(x, M, K, wp, y + p * PANEL, N);
    }
}

void q8_0_linear(const float *x, int64_t M, int64_t K, const int8_t *qs, const uint16_t *d, int64_t N, float *y,
                 float *scratch, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < N / PANEL; p++) {
        if (M <= SMALL_M) {
            fused_rows_q8_0(x, M, K, qs + p * K * 16, d + p * (K / BLOCK) * PANEL, y + p * PANEL, N);
            continue;
        }
        float *wp = scratch + (int64_t)omp_get_thread_num() * K * PANEL;
        decode_q8_0(qs + p * K * 16, d + p * (K / BLOCK) * PANEL, K, wp);
        rows(x, M, K, wp, y + p * PANEL, N);
    }
}
