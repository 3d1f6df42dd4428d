// Paged attention on the CPU: each new token's query heads read their sequence's keys and values in place in the
// paged cache, through its block table (no gather into a padded batch, no per-chunk GEMMs).
//
// Keys are kept transposed within each block, [blocks][kv heads][head_dim][block_size] (values as the base
// layout, [blocks][block_size][kv heads][head_dim]): a load of 16 keys' column c is one vector, so a row's scores
// are FMA chains over c with no horizontal sums, and the rows of a tile share each load.
//
// Batch-invariant by construction (cpu_attend.h): a row's arithmetic does not depend on the other rows of the
// call, their number, the threads, the CPU's vector width, or whether the row is a decode, a fresh prefill or an
// extend over a cached prefix: the same token gets the same bits everywhere.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
#include "../machine/cephes_exp.h"

#define MAX_ROWS 32  // rows of a tile: query heads per KV head times tokens
#define SCORE_PAD 32  // a group's scores run past its last key to the end of a 16-key vector

// One KV head of one sequence: its keys (k: the head's first column in block 0's layout) and values.
typedef struct {
    const float *k, *v;
    const int32_t *table;
    int64_t bs, hkv, d;
} Keys;

// 16 keys from p0 (a multiple of 16), column c at + c * *stride: in place where one block holds them (block_size
// a multiple of 16), else copied into buf (16 * d floats), keys past `last` as zeros (their scores are masked):
// the same lanes either way, so a block size changes no bits.
static inline const float *key_vector(const Keys *s, int64_t p0, int64_t last, float *buf, int64_t *stride) {
    if (s->bs % 16 == 0) {
        *stride = s->bs;
        return s->k + (int64_t)s->table[p0 / s->bs] * s->hkv * s->d * s->bs + p0 % s->bs;
    }
    for (int l = 0; l < 16; l++) {
        const int64_t p = p0 + l;
        const float *src = s->k + (int64_t)s->table[p <= last ? p / s->bs : 0] * s->hkv * s->d * s->bs + p % s->bs;
        for (int64_t c = 0; c < s->d; c++) buf[c * 16 + l] = p <= last ? src[c * s->bs] : 0.0f;
    }
    *stride = 16;
    return buf;
}

// Walks a row's values in position order through its block table: one division at the start, none per value.
typedef struct {
    const float *cache;
    const int32_t *table;
    int64_t block, offset, bs, stride;
} Cursor;

static inline Cursor value_cursor(const Keys *s, int64_t j) {
    return (Cursor){s->v, s->table, j / s->bs, j % s->bs, s->bs, s->hkv * s->d};
}

static inline const float *next_value(Cursor *c) {
    const float *row = c->cache + ((int64_t)c->table[c->block] * c->bs + c->offset) * c->stride;
    if (++c->offset == c->bs) c->offset = 0, c->block++;
    return row;
}

// The 8 lanes of v summed: (0+4, 1+5, 2+6, 3+7), then pairs, then the last two.
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax8(__m256 v) {  // a max is exact in any order
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// exp(x) for x <= 0 (a softmax's scores minus their max), Cephes' expf: x = n ln2 + r, 2^n * p(r). Within 2 ulp
// of expf; below -87.3 (and -inf, the keys a row does not see) it is exactly 0.
static inline __m256 exp8(__m256 x) {
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 y;
    EXP_POLY(_mm256, x, n, y);
    const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n)));
}

static inline float clip_lane(int64_t i) { return i < -1 ? -1.0f : i > 16 ? 16.0f : (float)i; }

// softcap * tanh(x / softcap), lane by lane (Gemma 2)
static inline void softcap16(float lanes[16], float softcap) {
    for (int u = 0; u < 16; u++) lanes[u] = tanhf(lanes[u] / softcap) * softcap;
}

// ---- AVX2: a vector of 16 lanes in two registers ----
typedef struct { __m256 lo, hi; } vf2;
#define V2(f) static inline __attribute__((always_inline)) vf2 v2_##f
V2(load)(const float *p) { return (vf2){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
V2(set1)(float x) { return (vf2){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
V2(zero)(void) { return (vf2){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
V2(mul)(vf2 a, vf2 b) { return (vf2){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
V2(add)(vf2 a, vf2 b) { return (vf2){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
V2(sub)(vf2 a, vf2 b) { return (vf2){_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
V2(div)(vf2 a, vf2 b) { return (vf2){_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
V2(max)(vf2 a, vf2 b) { return (vf2){_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
V2(fma)(vf2 a, vf2 b, vf2 c) { return (vf2){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
V2(exp)(vf2 x) { return (vf2){exp8(x.lo), exp8(x.hi)}; }
V2(outside)(vf2 x, int64_t first, int64_t last) {  // lanes before first or after last: -inf
    const __m256 a = _mm256_set1_ps(clip_lane(first)), b = _mm256_set1_ps(clip_lane(last));
    const __m256 l0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), l1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
    const __m256 inf = _mm256_set1_ps(-INFINITY);
    const __m256 m0 = _mm256_or_ps(_mm256_cmp_ps(l0, a, _CMP_LT_OQ), _mm256_cmp_ps(l0, b, _CMP_GT_OQ));
    const __m256 m1 = _mm256_or_ps(_mm256_cmp_ps(l1, a, _CMP_LT_OQ), _mm256_cmp_ps(l1, b, _CMP_GT_OQ));
    return (vf2){_mm256_blendv_ps(x.lo, inf, m0), _mm256_blendv_ps(x.hi, inf, m1)};
}
V2(softcap)(vf2 x, float softcap) {
    float lanes[16];
    _mm256_storeu_ps(lanes, x.lo), _mm256_storeu_ps(lanes + 8, x.hi);
    softcap16(lanes, softcap);
    return v2_load(lanes);
}
static inline void v2_store(float *p, vf2 x) { _mm256_storeu_ps(p, x.lo), _mm256_storeu_ps(p + 8, x.hi); }
static inline float v2_hsum(vf2 x) { return hsum8(_mm256_add_ps(x.lo, x.hi)); }  // (l + l+8), then hsum8's tree
static inline float v2_hmax(vf2 x) { return hmax8(_mm256_max_ps(x.lo, x.hi)); }

#define VF vf2
#define V(f) v2_##f
#define NV 1  // 16 ymm: 4 rows x 1 vector of accumulators, 2 keys, a broadcast
#define NC 1
#include "cpu_attend.h"
#undef VF
#undef V
#undef NV
#undef NC

// ---- AVX-512: the same lanes in one register ----
#pragma GCC push_options
#pragma GCC target("avx512f")
#define V5(f) static inline __attribute__((always_inline)) __m512 v5_##f
V5(load)(const float *p) { return _mm512_loadu_ps(p); }
V5(set1)(float x) { return _mm512_set1_ps(x); }
V5(zero)(void) { return _mm512_setzero_ps(); }
V5(mul)(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
V5(add)(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
V5(sub)(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
V5(div)(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
V5(max)(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
V5(fma)(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
V5(exp)(__m512 x) {  // exp8 in one register (through exp8 on the halves: 0.90-0.94x)
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                          _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 y;
    EXP_POLY(_mm512, x, n, y);
    const __m512i pow2n = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~under, y, _mm512_castsi512_ps(pow2n));
}
V5(outside)(__m512 x, int64_t first, int64_t last) {
    const __m512 lane = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __mmask16 m = _mm512_cmp_ps_mask(lane, _mm512_set1_ps(clip_lane(first)), _CMP_LT_OQ)
                      | _mm512_cmp_ps_mask(lane, _mm512_set1_ps(clip_lane(last)), _CMP_GT_OQ);
    return _mm512_mask_mov_ps(x, m, _mm512_set1_ps(-INFINITY));
}
V5(softcap)(__m512 x, float softcap) {
    float lanes[16];
    _mm512_storeu_ps(lanes, x);
    softcap16(lanes, softcap);
    return _mm512_loadu_ps(lanes);
}
static inline void v5_store(float *p, __m512 x) { _mm512_storeu_ps(p, x); }
static inline __m256 halves_added(__m512 x) {  // (l + l+8)
    return _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
}
static inline float v5_hsum(__m512 x) { return hsum8(halves_added(x)); }
static inline float v5_hmax(__m512 x) { return _mm512_reduce_max_ps(x); }

#define VF __m512
#define V(f) v5_##f
#define NV 2  // 32 zmm: 4 rows x 2 vectors of accumulators (eight FMA chains), or 4 x 4 for the values
#define NC 4
#include "cpu_attend.h"
#undef VF
#undef V
#undef NV
#undef NC
#pragma GCC pop_options

// Store the new tokens' K/V rows ([new, hkv * d] each) at their cache slots: values as they are, keys
// transposed into their block's [hkv][d][bs].
static void store_kv(const float *k, const float *v, float *k_cache, float *v_cache, const int64_t *slots,
                     int64_t new_tokens, int hkv, int d, int bs) {
    const int64_t stride = (int64_t)hkv * d;
    for (int64_t i = 0; i < new_tokens; i++) {
        float *kt = k_cache + slots[i] / bs * stride * bs + slots[i] % bs;
        for (int64_t e = 0; e < stride; e++) kt[e * bs] = k[i * stride + e];
        memcpy(v_cache + slots[i] * stride, v + i * stride, stride * sizeof(float));
    }
}

// One task: KV head kvh for the tokens first..first+count-1 of one sequence (consecutive positions). With a window
// each token sees keys from its own lo, so each is its own tile of G rows.
static void attend_tile(const float *q, float *out, const float *k_cache, const float *v_cache, int hq, int group,
                        int hkv, int d, int kvh, int64_t first, int count, const int32_t *pos, const int32_t *table,
                        int bs, float scale, int64_t window, float softcap, float *scratch, int wide) {
    const Keys keys = {k_cache + (int64_t)kvh * d * bs, v_cache + (int64_t)kvh * d, table, bs, hkv, d};
    const int per = window > 0 ? 1 : count;  // tokens that share a lo
    for (int t0 = 0; t0 < count; t0 += per) {
        const float *qs[MAX_ROWS];
        float *os[MAX_ROWS];
        int64_t his[MAX_ROWS];
        int R = 0;
        for (int t = t0; t < t0 + per; t++) {
            for (int g = 0; g < group; g++, R++) {
                const int64_t row = ((first + t) * hq + (int64_t)kvh * group + g) * d;
                qs[R] = q + row, os[R] = out + row, his[R] = pos[first + t];
            }
        }
        const int64_t hi = pos[first + t0];
        const int64_t lo = window > 0 && hi - window + 1 > 0 ? hi - window + 1 : 0;
        if (wide) v5_attend(d, R, qs, os, his, &keys, lo, scale, softcap, scratch);
        else v2_attend(d, R, qs, os, his, &keys, lo, scale, softcap, scratch);
    }
}

// q, out: [tokens, hq, d]; k, v: [tokens, hkv, d], stored first at slots; caches: [blocks, bs, hkv, d] in size
// (keys in the layout above); d a multiple of 16; pos: [tokens] each token's position; tiles:
// [num_tiles, 3] (the row of the tiles' sequence in tables, its first token, its token count <= MAX_ROWS /
// (hq / hkv)); tables: [batch, width]. A token at position p sees keys max(0, p - window + 1)..p (window <= 0:
// all); softcap <= 0: none. scratch: threads * RG * (max_len + SCORE_PAD) floats (a group's scores per thread).
// avx2_only: the AVX2 build on any CPU (the tests compare the two).
void paged_attention(const float *q, const float *k, const float *v, float *k_cache, float *v_cache,
                     const int64_t *slots, float *out, int64_t tokens, int hq, int hkv, int d, const int32_t *pos,
                     const int32_t *tiles, int64_t num_tiles, const int32_t *tables, int64_t width, int bs,
                     float scale, int64_t window, float softcap, float *scratch, int64_t max_len, int threads,
                     int avx2_only) {
    const int group = hq / hkv;
    const int wide = !avx2_only && __builtin_cpu_supports("avx512f");
    store_kv(k, v, k_cache, v_cache, slots, tokens, hkv, d, bs);
    // Tiles differ in length (a long prefill's last tokens see the most keys): hand them out one at a time.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t r = 0; r < num_tiles * hkv; r++) {
        const int32_t *tile = tiles + (r / hkv) * 3;
        float *scores = scratch + (int64_t)omp_get_thread_num() * RG * (max_len + SCORE_PAD);
        attend_tile(q, out, k_cache, v_cache, hq, group, hkv, d, (int)(r % hkv), tile[1], tile[2], pos,
                    tables + (int64_t)tile[0] * width, bs, scale, window, softcap, scores, wide);
    }
}

// RoPE (neox-style, half-split) of the q and k heads of x ([tokens, hq + hkv, d], rows x_stride floats apart) by
// each token's cos/sin rows ([tokens, d]), into q [tokens, hq, d] and k [tokens, hkv, d], contiguous for
// paged_attention: the decoder's torch form (x * cos + cat(-x2, x1) * sin, layers/rope.py) in one pass, the same
// bits: a product, a product, their sum, each rounded (no FMA contraction here).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static void rope_row(const float *x, const float *c, const float *s, int half, float *out) {
    int i = 0;
    for (; i + 8 <= half; i += 8) {
        const __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + half + i);
        const __m256 neg2 = _mm256_xor_ps(x2, _mm256_set1_ps(-0.0f));
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(x1, _mm256_loadu_ps(c + i)),
                                                _mm256_mul_ps(neg2, _mm256_loadu_ps(s + i))));
        _mm256_storeu_ps(out + half + i, _mm256_add_ps(_mm256_mul_ps(x2, _mm256_loadu_ps(c + half + i)),
                                                       _mm256_mul_ps(x1, _mm256_loadu_ps(s + half + i))));
    }
    for (; i < half; i++) {
        const float a = x[i] * c[i], b = -x[half + i] * s[i];
        const float e = x[half + i] * c[half + i], f = x[i] * s[half + i];
        out[i] = a + b;
        out[half + i] = e + f;
    }
}

void rope_split(const float *x, int64_t x_stride, int64_t tokens, int hq, int hkv, int d, const float *cos,
                const float *sin, float *q, float *k, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (tokens >= 64)
    for (int64_t t = 0; t < tokens; t++)
        for (int h = 0; h < hq + hkv; h++)
            rope_row(x + t * x_stride + (int64_t)h * d, cos + t * d, sin + t * d, d / 2,
                     h < hq ? q + (t * hq + h) * d : k + (t * hkv + h - hq) * d);
}
#pragma GCC pop_options
