// y[M, N] = x[M, K] @ W[N, K]^T with W in GGUF's Q4_1 or Q8_0 blocks (32 weights per block along K),
// repacked in panels of 16 output channels (layers/quant_linear.py describes the layout).
//
// Each panel is decoded to fp32 once per call (exactly as gguf's dequantize does: d * q + m, a multiply then
// an add, so the weights equal the de-quantized checkpoint bit for bit), then every row runs a 6x16 fp32
// micro-kernel over it. Every output element is one fused multiply-add chain over k = 0..K-1 in order, the
// same for every row count M and every row tile: a row's result never depends on its batch.
// At M <= SMALL_M (decode steps) the panel is decoded in registers inside the micro-kernel instead, one k at a
// time, with the same decode arithmetic and the same chain per output: no scratch written and read back (a
// panel is 36-98 KB, past L1), and the results are bitwise those of the scratch path. There one row takes 4
// panels at once and two rows 2, so that several independent FMA chains hide each other's latency.
#include <immintrin.h>
#include <stdint.h>
#include <omp.h>

#define PANEL 16
#define BLOCK 32
#define ROWS 6
#define SMALL_M 8
#define FUSED_ROWS 4
#define MAX_P 4  // panels decoded at once in the fused path

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

// Block b's scales (and mins) of 16 channels as fp32, for the fused path's FMAs to read from L1.
static inline __attribute__((always_inline)) void block_scales(const uint16_t *s, int64_t b, float *out) {
    _mm256_store_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + b * PANEL))));
    _mm256_store_ps(out + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + b * PANEL + 8))));
}

// Row k of a panel decoded: channels 0-7 and 8-15, d * q + m (Q4_1; the product of an fp16 scale and a 4-bit
// integer is exact, so this is the scratch path's value however it is compiled) or d * q (Q8_0).
static inline __attribute__((always_inline)) void weight_row(const int Q4, const uint8_t *qs, int64_t k,
                                                             const float *d, const float *m, __m256 w[2]) {
    __m256 q0, q1;
    if (Q4) {
        const __m128i low = _mm_set1_epi8(0x0F);
        const __m128i v = _mm_loadl_epi64((const __m128i *)(qs + k * 8));
        q0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(v, low)));
        q1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), low)));
        w[0] = _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(d), q0), _mm256_load_ps(m));
        w[1] = _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(d + 8), q1), _mm256_load_ps(m + 8));
    } else {
        const __m128i v = _mm_loadu_si128((const __m128i *)(qs + k * 16));
        q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
        w[0] = _mm256_mul_ps(_mm256_load_ps(d), q0);
        w[1] = _mm256_mul_ps(_mm256_load_ps(d + 8), q1);
    }
}

// Panels of one matrix: quants, scales and (Q4_1) mins. Q4 is a compile-time constant below.
typedef struct {
    const uint8_t *qs;
    const uint16_t *d, *m;
    int64_t K;
} Panels;

// The fused micro-kernel: R rows x P panels, each panel's row k decoded in registers, then the same FMAs.
static inline __attribute__((always_inline)) void fused(const int Q4, const int R, const int P, const float *x,
                                                        const Panels *w, int64_t p0, float *y, int64_t N) {
    const int64_t K = w->K, nb = K / BLOCK;
    __attribute__((aligned(32))) float d[MAX_P][PANEL], m[MAX_P][PANEL];
    __m256 acc[FUSED_ROWS * MAX_P][2];
    for (int i = 0; i < R * P; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        for (int p = 0; p < P; p++) {
            block_scales(w->d + (p0 + p) * nb * PANEL, b, d[p]);
            if (Q4) block_scales(w->m + (p0 + p) * nb * PANEL, b, m[p]);
        }
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++) {
            for (int p = 0; p < P; p++) {
                __m256 wk[2];
                weight_row(Q4, w->qs + (p0 + p) * K * (Q4 ? 8 : 16), k, d[p], m[p], wk);
                fma_rows(R, x, K, k, wk[0], wk[1], acc + p * R);
            }
        }
    }
    for (int p = 0; p < P; p++) store_rows(R, acc + p * R, y + (p0 + p) * PANEL, N);
}

#define FUSED(R_, P_, p_) fused(Q4, R_, P_, x + r * w->K, w, p_, y + r * N, N)

// Panels p0..p0+P-1 (P <= 4) for all M <= SMALL_M rows: a lone row takes 4 panels at once, two rows 2, three or
// four rows 1 (16 registers hold 8 accumulators and the decode).
static inline __attribute__((always_inline)) void fused_panels(const int Q4, const float *x, int64_t M,
                                                               const Panels *w, int64_t p0, int P, float *y,
                                                               int64_t N) {
    for (int64_t r = 0; r < M; r += FUSED_ROWS) {
        const int64_t R = M - r < FUSED_ROWS ? M - r : FUSED_ROWS;
        int q = 0;
        if (R == 1) {
            for (; q + 4 <= P; q += 4) FUSED(1, 4, p0 + q);
            for (; q < P; q++) FUSED(1, 1, p0 + q);
        } else if (R == 2) {
            for (; q + 2 <= P; q += 2) FUSED(2, 2, p0 + q);
            for (; q < P; q++) FUSED(2, 1, p0 + q);
        } else {
            for (; q < P; q++) {
                if (R == 4) FUSED(4, 1, p0 + q); else FUSED(3, 1, p0 + q);
            }
        }
    }
}

// Each thread takes a contiguous run of panels (as even as panels allow); the fused path walks it MAX_P panels
// at a time. A tiling choice only: each element's arithmetic is the same whoever computes it.
// scratch: threads * 2 * K * 16 floats, 32-byte aligned (a thread decodes one panel into its half).
static inline __attribute__((always_inline)) void linear(const int Q4, const float *x, int64_t M, const Panels *w,
                                                         int64_t N, float *y, float *scratch, int threads) {
    const int64_t panels = N / PANEL, K = w->K, nb = K / BLOCK;
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        const int64_t lo = panels * t / n, hi = panels * (t + 1) / n;
        float *wp = scratch + (int64_t)t * 2 * K * PANEL;
        for (int64_t p = lo; p < hi; p += M <= SMALL_M ? MAX_P : 1) {
            if (M <= SMALL_M) {
                fused_panels(Q4, x, M, w, p, hi - p < MAX_P ? (int)(hi - p) : MAX_P, y, N);
            } else {
                if (Q4) decode_q4_1(w->qs + p * K * 8, w->d + p * nb * PANEL, w->m + p * nb * PANEL, K, wp);
                else decode_q8_0((const int8_t *)w->qs + p * K * 16, w->d + p * nb * PANEL, K, wp);
                rows(x, M, K, wp, y + p * PANEL, N);
            }
        }
    }
}

void q4_1_linear(const float *x, int64_t M, int64_t K, const uint8_t *qs, const uint16_t *d, const uint16_t *mn,
                 int64_t N, float *y, float *scratch, int threads) {
    const Panels w = {qs, d, mn, K};
    linear(1, x, M, &w, N, y, scratch, threads);
}

void q8_0_linear(const float *x, int64_t M, int64_t K, const int8_t *qs, const uint16_t *d, int64_t N, float *y,
                 float *scratch, int threads) {
    const Panels w = {(const uint8_t *)qs, d, NULL, K};
    linear(0, x, M, &w, N, y, scratch, threads);
}
