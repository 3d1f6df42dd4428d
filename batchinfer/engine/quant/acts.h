// Activations quantized per row, as llama.cpp quantizes them for each weight type's dot product:
//   Q8_0/Q8_1 (32-types): per 32, d = amax / 127, q = round(x / d) (nearest even, as ggml's AVX2 code), d kept as
//     its fp16 value, s = fp16(d * sum(q)) (the Q4_1/Q5_1 min's multiplier), and sum(q) per block.
//   Q8_K (K-quants): per 256, the largest |x| maps to -128: iscale = -128 / max, q = min(127, round(iscale x)),
//     d = 1 / iscale, and sum(q) per 16.
// A row's quantization depends on that row alone, so a row's result never depends on its batch. The same AVX2
// code runs in every build (and the scalar reference takes its output), so every path sees the same integers.
#pragma once
#include <immintrin.h>
#include "qtypes.h"

typedef struct {
    const int8_t *q;     // [rows][K] (rows padded to 32 with zeros for the AMX tiles)
    const float *d;      // [M][K / sb]: per block (32-types) or super-block (K-quants)
    const float *s;      // [M][K / 32]: fp16(d * sum(q)), 32-types only
    const int32_t *bsum; // [M][K / 32] (32-types) or [M][K / 16] (K-quants): sums of q
    int64_t K;
    const uint32_t *pairs; // K-quants: [M][K / 256][8], the groups' sums of q two by two as int16 pairs (gemm makes them)
} act_t;

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline int32_t hsum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// 8 floats * scale, rounded to nearest even, to int32.
static inline __m256i round8(__m256 x, __m256 scale) {
    return _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(x, scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 32 int32 (4 vectors) -> 32 int8, in order.
static inline void store_i8x32(int8_t *out, __m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    _mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

static void quantize_row_q8_0(const float *x, int64_t K, int8_t *q, float *d, float *s, int32_t *bsum) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t b = 0; b < K / 32; b++) {
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(x + 32 * b + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_and_ps(v[j], absmask));
        }
        const float dd = hmax8(amax) / 127.0f;
        const __m256 id = _mm256_set1_ps(dd != 0.0f ? 1.0f / dd : 0.0f);
        __m256i i[4];
        for (int j = 0; j < 4; j++) i[j] = round8(v[j], id);
        const int32_t sum = hsum8(_mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3])));
        store_i8x32(q + 32 * b, i[0], i[1], i[2], i[3]);
        d[b] = fp16_to_f32(f32_to_fp16(dd));
        s[b] = fp16_to_f32(f32_to_fp16(dd * (float)sum));
        bsum[b] = sum;
    }
}

static void quantize_row_q8_K(const float *x, int64_t K, int8_t *q, float *d, int32_t *bsum) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t b = 0; b < K / QK; b++) {
        const float *xb = x + QK * b;
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < QK / 8; j++) amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_loadu_ps(xb + 8 * j), absmask));
        const __m256 top = _mm256_set1_ps(hmax8(amax));
        float max = 0.0f;
        for (int j = 0; j < QK / 8; j++) {  // ggml keeps the first element of the largest magnitude, with its sign
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(xb + 8 * j), absmask), top, _CMP_EQ_OQ));
            if (hit) { max = xb[8 * j + __builtin_ctz((unsigned)hit)]; break; }
        }
        if (max == 0.0f) {
            memset(q + QK * b, 0, QK);
            memset(bsum + 16 * b, 0, 16 * sizeof(int32_t));
            d[b] = 0.0f;
            continue;
        }
        const float iscale = -128.0f / max;
        const __m256 is = _mm256_set1_ps(iscale);
        const __m256i hi = _mm256_set1_epi32(127);
        for (int j = 0; j < QK / 32; j++) {
            __m256i i[4];
            for (int c = 0; c < 4; c++) i[c] = _mm256_min_epi32(round8(_mm256_loadu_ps(xb + 32 * j + 8 * c), is), hi);
            store_i8x32(q + QK * b + 32 * j, i[0], i[1], i[2], i[3]);
            bsum[16 * b + 2 * j] = hsum8(_mm256_add_epi32(i[0], i[1]));
            bsum[16 * b + 2 * j + 1] = hsum8(_mm256_add_epi32(i[2], i[3]));
        }
        d[b] = 1.0f / iscale;
    }
}

// x [M, K] float32, rows ldx floats apart -> the activations of weight type t's scheme (q padded to rows_padded
// rows of zeros, a multiple of 32).
static void quantize_rows(int t, const float *x, int64_t ldx, int64_t M, int64_t K, int64_t rows_padded, int8_t *q,
                          float *d, float *s, int32_t *bsum, int threads) {
    const int kq = QT[t].kquant;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        if (kq) quantize_row_q8_K(x + m * ldx, K, q + m * K, d + m * (K / QK), bsum + m * (K / 16));
        else quantize_row_q8_0(x + m * ldx, K, q + m * K, d + m * (K / 32), s + m * (K / 32), bsum + m * (K / 32));
    }
    if (rows_padded > M) memset(q + M * K, 0, (size_t)((rows_padded - M) * K));
}
