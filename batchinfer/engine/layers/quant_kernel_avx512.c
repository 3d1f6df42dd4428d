// quant_kernel.c for CPUs with AVX-512: the same layout, the same exported functions, the same bits.
//
// A panel's 16 output channels fill one zmm instead of two ymm. Every output element is still one fused
// multiply-add chain over k = 0..K-1 in order, and every weight is decoded with the same arithmetic
// (d * q + m: the product of an fp16 scale and a 4- or 8-bit integer is exact in fp32, so the decode has one
// rounding however it is compiled). So each output is bitwise what the AVX2 build computes, for every row
// count and tile: workers on either kind of CPU give the same answers. What changes is the work per
// instruction (16 lanes) and the tiles: 32 registers hold a tile of several panels, so a weight row or an x
// value loaded once feeds more FMAs, and at decode's few rows several independent chains hide FMA latency.
#include <immintrin.h>
#include <stdint.h>
#include <omp.h>

#define PANEL 16
#define BLOCK 32
#define ROWS 12  // scratch path: a tile of 12 rows x 2 panels (24 accumulators)
#define SMALL_M 8
#define FUSED_ROWS 4  // fused path: up to 4 rows x 2 panels, or 2 rows x 4 panels (8 accumulators)
#define MAX_P 4

// One k of every output's chain: acc[r][p] += x[r][k] * w[p], for R rows and P panels.
static inline __attribute__((always_inline)) void fma_tile(const int R, const int P, const float *x, int64_t K,
                                                           int64_t k, const __m512 w[], __m512 acc[][MAX_P]) {
    for (int r = 0; r < R; r++) {
        const __m512 xb = _mm512_set1_ps(x[r * K + k]);
        for (int p = 0; p < P; p++) acc[r][p] = _mm512_fmadd_ps(xb, w[p], acc[r][p]);
    }
}

static inline __attribute__((always_inline)) void zero_tile(const int R, const int P, __m512 acc[][MAX_P]) {
    for (int r = 0; r < R; r++)
        for (int p = 0; p < P; p++) acc[r][p] = _mm512_setzero_ps();
}

static inline __attribute__((always_inline)) void store_tile(const int R, const int P, __m512 acc[][MAX_P], float *y,
                                                             int64_t N) {
    for (int r = 0; r < R; r++)
        for (int p = 0; p < P; p++) _mm512_storeu_ps(y + r * N + p * PANEL, acc[r][p]);
}

// 16 channels' scales of block b (fp16 -> fp32).
static inline __attribute__((always_inline)) __m512 scales(const uint16_t *s, int64_t b) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + b * PANEL)));
}

// Row k of a Q4_1 panel: byte j holds channel j (low nibble) and channel j + 8 (high) -> 16 floats in order.
static inline __attribute__((always_inline)) __m512 q4_row(const uint8_t *qs, int64_t k) {
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i v = _mm_loadl_epi64((const __m128i *)(qs + k * 8));
    const __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi64(lo, hi)));
}

static inline __attribute__((always_inline)) __m512 q8_row(const int8_t *qs, int64_t k) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + k * 16))));
}

// A run of panels in the layout: the quants, scales and (Q4_1) mins of panel p. Q4 is a compile-time constant
// in every function below (they inline into q4_1_linear and q8_0_linear), so the format costs no branch.
typedef struct {
    const uint8_t *qs;
    const uint16_t *d, *m;
    int64_t K;
} Panels;

static inline __attribute__((always_inline)) const uint16_t *panel_d(const Panels *w, int64_t p) {
    return w->d + p * (w->K / BLOCK) * PANEL;
}

// Weight row k of panel p, decoded: d * q + m (Q4_1) or d * q (Q8_0), with block k / 32's d and m.
static inline __attribute__((always_inline)) __m512 weight_row(const int Q4, const Panels *w, int64_t p, int64_t k,
                                                              __m512 d, __m512 m) {
    if (Q4) return _mm512_add_ps(_mm512_mul_ps(d, q4_row(w->qs + p * w->K * 8, k)), m);
    return _mm512_mul_ps(d, q8_row((const int8_t *)w->qs + p * w->K * 16, k));
}

static inline __attribute__((always_inline)) void block_scales(const int Q4, const Panels *w, int64_t p, int64_t b,
                                                               __m512 *d, __m512 *m) {
    *d = scales(panel_d(w, p), b);
    *m = Q4 ? scales(w->m + (panel_d(w, p) - w->d), b) : _mm512_setzero_ps();
}

// Fused path (few rows): R rows x P panels decoded in registers one k at a time, then the same FMAs.
static inline __attribute__((always_inline)) void fused(const int Q4, const int R, const int P, const float *x,
                                                        const Panels *w, int64_t p0, float *y, int64_t N) {
    __m512 acc[FUSED_ROWS][MAX_P], wk[MAX_P], d[MAX_P], m[MAX_P];
    zero_tile(R, P, acc);
    for (int64_t b = 0; b < w->K / BLOCK; b++) {
        for (int p = 0; p < P; p++) block_scales(Q4, w, p0 + p, b, &d[p], &m[p]);
        for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++) {
            for (int p = 0; p < P; p++) wk[p] = weight_row(Q4, w, p0 + p, k, d[p], m[p]);
            fma_tile(R, P, x, w->K, k, wk, acc);
        }
    }
    store_tile(R, P, acc, y + p0 * PANEL, N);
}

#define FUSED(R_, P_, p_) fused(Q4, R_, P_, x + m * w->K, w, p_, y + m * N, N)
#define FUSED_ROWS_OF(P_, p_) switch (R) { \
        case 4: FUSED(4, P_, p_); break; case 3: FUSED(3, P_, p_); break; \
        case 2: FUSED(2, P_, p_); break; default: FUSED(1, P_, p_); break; }

// Panels p0..p0+P-1 (P <= 4) for all M <= SMALL_M rows: 1-2 rows take 4 panels at once (four independent chains
// a row hide the FMA latency), 3-4 rows take 2 at a time.
static inline __attribute__((always_inline)) void fused_panels(const int Q4, const float *x, int64_t M,
                                                               const Panels *w, int64_t p0, int P, float *y,
                                                               int64_t N) {
    for (int64_t m = 0; m < M; m += FUSED_ROWS) {
        const int64_t R = M - m < FUSED_ROWS ? M - m : FUSED_ROWS;
        if (R <= 2 && P == 4) {
            if (R == 2) FUSED(2, 4, p0); else FUSED(1, 4, p0);
            continue;
        }
        int q = 0;
        for (; q + 2 <= P; q += 2) FUSED_ROWS_OF(2, p0 + q)
        if (q < P) FUSED_ROWS_OF(1, p0 + q)
    }
}

// Scratch path: P panels decoded to fp32, interleaved by k (wp: K * P * 16 floats), then tiles of ROWS x P.
static inline __attribute__((always_inline)) void decode_panels(const int Q4, const Panels *w, int64_t p0, int P,
                                                                float *wp) {
    for (int p = 0; p < P; p++) {
        for (int64_t b = 0; b < w->K / BLOCK; b++) {
            __m512 d, m;
            block_scales(Q4, w, p0 + p, b, &d, &m);
            for (int64_t k = b * BLOCK; k < (b + 1) * BLOCK; k++) {
                _mm512_store_ps(wp + (k * P + p) * PANEL, weight_row(Q4, w, p0 + p, k, d, m));
            }
        }
    }
}

static inline __attribute__((always_inline)) void micro(const int R, const int P, const float *x, int64_t K,
                                                        const float *wp, float *y, int64_t N) {
    __m512 acc[ROWS][MAX_P], wk[MAX_P];
    zero_tile(R, P, acc);
    for (int64_t k = 0; k < K; k++) {
        for (int p = 0; p < P; p++) wk[p] = _mm512_load_ps(wp + (k * P + p) * PANEL);
        fma_tile(R, P, x, K, k, wk, acc);
    }
    store_tile(R, P, acc, y, N);
}

#define TAIL(R) case R: micro(R, P, x + m * K, K, wp, y + m * N, N); break;

static inline __attribute__((always_inline)) void rows(const int P, const float *x, int64_t M, int64_t K,
                                                       const float *wp, float *y, int64_t N) {
    int64_t m = 0;
    for (; m + ROWS <= M; m += ROWS) micro(ROWS, P, x + m * K, K, wp, y + m * N, N);
    switch (M - m) {  // the tail: the same chain per element, fewer rows at once
        TAIL(11) TAIL(10) TAIL(9) TAIL(8) TAIL(7) TAIL(6) TAIL(5) TAIL(4) TAIL(3) TAIL(2) TAIL(1)
        default: break;
    }
}

// Each thread takes a contiguous run of panels (as even as panels allow) and walks it in groups: the group is a
// tiling choice, each element's arithmetic is the same whoever computes it and whatever its group.
// scratch: threads * 2 * K * 16 floats, 64-byte aligned.
static inline __attribute__((always_inline)) void linear(const int Q4, const float *x, int64_t M, const Panels *w,
                                                         int64_t N, float *y, float *scratch, int threads) {
    const int64_t panels = N / PANEL;
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        const int64_t lo = panels * t / n, hi = panels * (t + 1) / n;
        float *wp = scratch + (int64_t)t * 2 * w->K * PANEL;
        const int group = M <= SMALL_M ? MAX_P : 2;
        for (int64_t p = lo; p < hi; p += group) {
            const int P = hi - p < group ? (int)(hi - p) : group;
            if (M <= SMALL_M) {
                fused_panels(Q4, x, M, w, p, P, y, N);
            } else if (P == 2) {
                decode_panels(Q4, w, p, 2, wp);
                rows(2, x, M, w->K, wp, y + p * PANEL, N);
            } else {
                decode_panels(Q4, w, p, 1, wp);
                rows(1, x, M, w->K, wp, y + p * PANEL, N);
            }
        }
    }
}

// qs: [N/16, K, 8] bytes, byte j of row k = q[col j] | q[col j + 8] << 4; d, m: [N/16, K/32, 16] fp16.
void q4_1_linear(const float *x, int64_t M, int64_t K, const uint8_t *qs, const uint16_t *d, const uint16_t *mn,
                 int64_t N, float *y, float *scratch, int threads) {
    const Panels w = {qs, d, mn, K};
    linear(1, x, M, &w, N, y, scratch, threads);
}

// qs: [N/16, K, 16] int8; d: [N/16, K/32, 16] fp16.
void q8_0_linear(const float *x, int64_t M, int64_t K, const int8_t *qs, const uint16_t *d, int64_t N, float *y,
                 float *scratch, int threads) {
    const Panels w = {(const uint8_t *)qs, d, NULL, K};
    linear(0, x, M, &w, N, y, scratch, threads);
}
