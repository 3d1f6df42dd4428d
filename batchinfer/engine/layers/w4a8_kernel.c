// y[M, N] = x[M, K] @ W[N, K]^T with W in GGUF's Q4_1 blocks and x quantized to int8 per row and per 32-block
// along K (llama.cpp's Q4_1 x Q8_1 arithmetic), integer dot products inside each block.
//
// Activations, as ggml's quantize_row_q8_1: dx = amax / 127, qx = round-to-nearest-even(x * (1 / dx)) in
// [-127, 127], sx = sum(qx). A row's quantization depends on that row alone.
// Weights (layers/w4a8_linear.py repacks them): per panel of 16 output channels and per group of 4 k, 32 bytes,
// byte 4c + i = q[c][k + i] | q[c + 8][k + i] << 4 (c = 0..7): the low nibbles are channels 0-7, the high ones
// 8-15, each channel's 4 weights adjacent, so maddubs(w, broadcast(qx[k..k+3])) then madd(.., ones) is 8 channels'
// int32 sums. Pair sums are at most 2 * 15 * 127 = 3810, so a block's 8 groups add up in int16 (<= 30480) before
// one madd with ones per block.
// Per block b (in order), per output: acc = fma(float(isum), d_w * dx, acc); acc = fma(m_w, dx * sx, acc)
// (Q4_1: w = d q + m). Integer sums are exact and the float steps are the same whatever the row count and row
// tile: a row's result never depends on its batch.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define PANEL 16
#define BLOCK 32
#define TILE 8

static inline float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// One row: qx [K] int8; dx, dsx [K/32] (dsx = dx * sum(qx), the Q4_1 offset's multiplier).
static void quantize_row(const float *x, int64_t K, int8_t *qx, float *dx, float *dsx) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < K / BLOCK; b++) {
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + b * BLOCK + j * 8);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        const float d = hmax(amax) / 127.0f;
        const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        __m256i i[4];
        for (int j = 0; j < 4; j++)
            i[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id),
                                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const int32_t s = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256((__m256i *)(qx + b * BLOCK), _mm256_permutevar8x32_epi32(p, perm));
        dx[b] = d;
        dsx[b] = d * (float)s;
    }
}

static inline __m256i broadcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// R rows x 8 channels (half h: the low nibbles, channels 0-7, or the high ones, 8-15) of one panel.
// qs: the panel's [K/4, 32] bytes; d, mn: its [K/32, 16] fp16 scales. One half at a time keeps R int16
// accumulators, the weights and a broadcast in registers for R up to TILE.
static inline __attribute__((always_inline)) void tile(const int R, const int h, const int8_t *qx, const float *dx,
                                                       const float *dsx, int64_t K, const uint8_t *qs,
                                                       const uint16_t *d, const uint16_t *mn, float *y, int64_t N) {
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int64_t nb = K / BLOCK;
    __m256 acc[TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i s[TILE];
        for (int r = 0; r < R; r++) s[r] = _mm256_setzero_si256();
        for (int g = 0; g < BLOCK / 4; g++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + (b * BLOCK / 4 + g) * 32));
            const __m256i w = _mm256_and_si256(h ? _mm256_srli_epi16(v, 4) : v, low);
            for (int r = 0; r < R; r++)
                s[r] = _mm256_add_epi16(s[r], _mm256_maddubs_epi16(w, broadcast4(qx + r * K + b * BLOCK + g * 4)));
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(d + b * PANEL + 8 * h)));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mn + b * PANEL + 8 * h)));
        for (int r = 0; r < R; r++) {
            const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(s[r], ones));
            acc[r] = _mm256_fmadd_ps(f, _mm256_mul_ps(dw, _mm256_set1_ps(dx[r * nb + b])), acc[r]);
            acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(dsx[r * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * N + 8 * h, acc[r]);
}

static inline __attribute__((always_inline)) void halves(const int R, const int8_t *qx, const float *dx,
                                                         const float *dsx, int64_t K, const uint8_t *qs,
                                                         const uint16_t *d, const uint16_t *mn, float *y,
                                                         int64_t N) {
    tile(R, 0, qx, dx, dsx, K, qs, d, mn, y, N);
    tile(R, 1, qx, dx, dsx, K, qs, d, mn, y, N);
}

static void rows(const int8_t *qx, const float *dx, const float *dsx, int64_t M, int64_t K, const uint8_t *qs,
                 const uint16_t *d, const uint16_t *mn, float *y, int64_t N) {
    const int64_t nb = K / BLOCK;
    for (int64_t m = 0; m < M; m += TILE) {
        const int8_t *q = qx + m * K;
        const float *a = dx + m * nb, *s = dsx + m * nb;
        switch (M - m < TILE ? M - m : TILE) {  // the tail: the same arithmetic per output, fewer rows at once
            case 8: halves(8, q, a, s, K, qs, d, mn, y + m * N, N); break;
            case 7: halves(7, q, a, s, K, qs, d, mn, y + m * N, N); break;
            case 6: halves(6, q, a, s, K, qs, d, mn, y + m * N, N); break;
            case 5: halves(5, q, a, s, K, qs, d, mn, y + m * N, N); break;
            case 4: halves(4, q, a, s, K, qs, d, mn, y + m * N, N); break;
            case 3: halves(3, q, a, s, K, qs, d, mn, y + m * N, N); break;
            case 2: halves(2, q, a, s, K, qs, d, mn, y + m * N, N); break;
            default: halves(1, q, a, s, K, qs, d, mn, y + m * N, N); break;
        }
    }
}

// Rows are quantized in parallel, then panels are split among threads.
// qx: M * K int8 scratch; dx, dsx: M * K/32 floats of scratch (the callers' so the kernel allocates nothing).
void w4a8_linear(const float *x, int64_t M, int64_t K, const uint8_t *qs, const uint16_t *d, const uint16_t *mn,
                 int64_t N, float *y, int8_t *qx, float *dx, float *dsx, int threads) {
    const int64_t nb = K / BLOCK;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) quantize_row(x + m * K, K, qx + m * K, dx + m * nb, dsx + m * nb);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < N / PANEL; p++)
            rows(qx, dx, dsx, M, K, qs + p * K * 8, d + p * nb * PANEL, mn + p * nb * PANEL, y + p * PANEL, N);
    }
}

// The activation quantization alone, for tests.
void q8_rows(const float *x, int64_t M, int64_t K, int8_t *qx, float *dx, float *dsx) {
    for (int64_t m = 0; m < M; m++) quantize_row(x + m * K, K, qx + m * K, dx + m * K / BLOCK, dsx + m * K / BLOCK);
}
