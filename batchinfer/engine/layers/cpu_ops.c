// The quantized models' float32 glue on the CPU (layers/cpu_ops.py): RMSNorm with the residual add before it, and
// SwiGLU, each one pass over its rows.
//
// A row's arithmetic is its own, so a token gets the same bits in any batch. Both builds compute 16 lanes the
// same way (AVX2 in two registers), so a row gets the same bits on every CPU:
//   rms_norm: s = fma chains of x[i]^2 in 16 lanes (lane i mod 16, ascending i), then (l + l+8), then a fixed tree
//   over 8; r = 1 / sqrt(s / h + eps); out[i] = (x[i] * r) * w[i];
//   silu_mul: out[i] = g / (1 + exp(-g)) * u, exp Cephes' expf on [-87.3, 88.3] (arguments clamped).
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include "../machine/cephes_exp.h"

#define PARALLEL_FROM (1 << 15)  // elements from which a call splits its rows over the threads

static inline float hsum8(__m256 v) {  // (0+4, 1+5, 2+6, 3+7), then pairs, then the last two
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256i tail_mask8(int n) {  // lanes 0..n-1 (n may be <= 0 or >= 8)
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
}

// Cephes' expf on [-87.3, 88.3] (arguments clamped): x = n ln2 + r, 2^n * p(r) (cephes_exp.h). One body for both
// widths (P: the intrinsics' prefix, FLOOR and CAST: its floor and int-to-float cast), so the two builds give the
// same bits.
#define EXP_CLAMPED(P, FLOOR, CAST, x, out) do {                                                            \
    x = P##_min_ps(P##_max_ps(x, P##_set1_ps(-87.3f)), P##_set1_ps(88.3f));                             \
    const __typeof__(x) n = FLOOR(P##_fmadd_ps(x, P##_set1_ps(1.44269504088896341f), P##_set1_ps(0.5f))); \
    __typeof__(x) y;                                                                                    \
    EXP_POLY(P, x, n, y);                                                                               \
    out = P##_mul_ps(y, CAST(P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23)));  \
} while (0)

static inline __m256 exp8(__m256 x) {
    __m256 out;
    EXP_CLAMPED(_mm256, _mm256_floor_ps, _mm256_castsi256_ps, x, out);
    return out;
}

// ---- AVX2 (the 16 lanes in two registers) ----
static float ssq_avx2(const float *x, int h) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int i = 0; i < h; i += 16) {
        const __m256 a = _mm256_maskload_ps(x + i, tail_mask8(h - i));
        const __m256 b = _mm256_maskload_ps(x + i + 8, tail_mask8(h - i - 8));
        lo = _mm256_fmadd_ps(a, a, lo), hi = _mm256_fmadd_ps(b, b, hi);
    }
    return hsum8(_mm256_add_ps(lo, hi));
}

static void scale_avx2(const float *x, const float *w, float r, int h, float *out) {
    const __m256 rv = _mm256_set1_ps(r);
    for (int i = 0; i < h; i += 8) {
        const __m256i m = tail_mask8(h - i);
        const __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(x + i, m), rv), _mm256_maskload_ps(w + i, m));
        _mm256_maskstore_ps(out + i, m, v);
    }
}

static void add_avx2(float *x, const float *y, int h) {
    for (int i = 0; i < h; i += 8) {
        const __m256i m = tail_mask8(h - i);
        _mm256_maskstore_ps(x + i, m, _mm256_add_ps(_mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m)));
    }
}

static void silu_mul_avx2(float *g, const float *u, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < n; i += 8) {
        const __m256i m = tail_mask8(n - i);
        const __m256 x = _mm256_maskload_ps(g + i, m);
        const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_xor_ps(x, neg))));
        _mm256_maskstore_ps(g + i, m, _mm256_mul_ps(s, _mm256_maskload_ps(u + i, m)));
    }
}

// ---- AVX-512: the same lanes in one register ----
#pragma GCC push_options
#pragma GCC target("avx512f")
static inline __mmask16 tail_mask16(int n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

static inline __m512 floor16(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }

static inline __m512 exp16(__m512 x) {
    __m512 out;
    EXP_CLAMPED(_mm512, floor16, _mm512_castsi512_ps, x, out);
    return out;
}

static float ssq_avx512(const float *x, int h) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < h; i += 16) {
        const __m512 a = _mm512_maskz_loadu_ps(tail_mask16(h - i), x + i);
        acc = _mm512_fmadd_ps(a, a, acc);
    }
    const __m256 lo = _mm512_castps512_ps256(acc);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
    return hsum8(_mm256_add_ps(lo, hi));
}

static void scale_avx512(const float *x, const float *w, float r, int h, float *out) {
    const __m512 rv = _mm512_set1_ps(r);
    for (int i = 0; i < h; i += 16) {
        const __mmask16 m = tail_mask16(h - i);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), rv),
                                                        _mm512_maskz_loadu_ps(m, w + i)));
    }
}

static void add_avx512(float *x, const float *y, int h) {
    for (int i = 0; i < h; i += 16) {
        const __mmask16 m = tail_mask16(h - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
    }
}

static void silu_mul_avx512(float *g, const float *u, int n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000);
    for (int i = 0; i < n; i += 16) {
        const __mmask16 m = tail_mask16(n - i);
        const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        const __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), sign)))));
        _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}
#pragma GCC pop_options

static int wide(int avx2_only) { return !avx2_only && __builtin_cpu_supports("avx512f"); }

// x [n rows, ldx apart] += y [n, ldy apart] where y is given; then out [n, h] = RMSNorm(x) * w where w is given.
void add_rms_norm(float *x, int64_t ldx, const float *y, int64_t ldy, const float *w, float eps, int64_t n, int h,
                  float *out, int threads, int avx2_only) {
    const int v5 = wide(avx2_only);
#pragma omp parallel for schedule(static) num_threads(threads) if (n * h >= PARALLEL_FROM)
    for (int64_t t = 0; t < n; t++) {
        float *row = x + t * ldx;
        if (y) v5 ? add_avx512(row, y + t * ldy, h) : add_avx2(row, y + t * ldy, h);
        if (!w) continue;
        const float s = v5 ? ssq_avx512(row, h) : ssq_avx2(row, h);
        const float r = 1.0f / sqrtf(s / (float)h + eps);
        v5 ? scale_avx512(row, w, r, h, out + t * h) : scale_avx2(row, w, r, h, out + t * h);
    }
}

// gate_up [n rows, ld apart: gate in columns 0..inter-1, up after]: gate <- silu(gate) * up, in place.
void silu_mul(float *gate_up, int64_t ld, int64_t n, int inter, int threads, int avx2_only) {
    const int v5 = wide(avx2_only);
#pragma omp parallel for schedule(static) num_threads(threads) if (n * inter >= PARALLEL_FROM)
    for (int64_t t = 0; t < n; t++) {
        float *g = gate_up + t * ld;
        v5 ? silu_mul_avx512(g, g + inter, inter) : silu_mul_avx2(g, g + inter, inter);
    }
}
