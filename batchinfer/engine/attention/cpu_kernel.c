// Paged attention on the CPU (AVX2, FMA): each new token's query heads read their sequence's keys and values in
// place in the paged cache, through its block table (no gather into a padded batch, no per-chunk GEMMs).
//
// Batch-invariant by construction: one (token, query head) row at a time. Its keys are taken in position order
// in groups of 8 from its first visible key; each score is one dot product (one FMA chain over head_dim, then
// one fixed reduction tree over the 8 lanes); the softmax's exps are one polynomial, summed lane-wise then over
// the lanes in a fixed tree; the values are summed in position order. Nothing in a row's arithmetic depends on
// the other rows of the call, their number, the threads, or whether the row is a decode, a fresh prefill or an
// extend over a cached prefix: the same token gets the same bits everywhere.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>

#define MAX_D 256
#define KEYS 8  // keys per score group: one vector of 8 scores
#define VCHUNK 32  // values per chunk: 8 KB at head_dim 64
#define MAX_ROWS 32  // rows of a tile: query heads per KV head times tokens

// The 8 lanes of v summed: (0+4, 1+5, 2+6, 3+7), then pairs, then the last two.
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax(__m256 v) {  // a max is exact in any order
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Four keys' dot vectors reduced to one vector: lanes (0..3, 4..7) hold ((0+1)+(2+3)) and ((4+5)+(6+7)) of each.
static inline __m256 hsum4(const __m256 d[4]) {
    return _mm256_hadd_ps(_mm256_hadd_ps(d[0], d[1]), _mm256_hadd_ps(d[2], d[3]));
}

// Lane u of the result is the sum of key u's 8 lanes, ((0+1)+(2+3)) + ((4+5)+(6+7)), the same tree for every u.
static inline __m256 hsum8(__m256 a, __m256 b) {
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// exp(x) for x <= 0 (a softmax's scores minus their max), Cephes' expf: x = n ln2 + r, 2^n * p(r). Within 2 ulp
// of expf; below -87.3 (and -inf, the lanes past a row's last key) it is exactly 0.
static inline __m256 exp_ps(__m256 x) {
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n)));
}

// Walks a row's keys in position order through its block table: one division at the start, none per key.
typedef struct {
    const float *cache;
    const int32_t *table;
    int64_t block, offset, bs, stride;
} Cursor;

static inline Cursor cursor(const float *cache, const int32_t *table, int64_t j, int bs, int64_t stride) {
    return (Cursor){cache, table, j / bs, j % bs, bs, stride};
}

static inline const float *next_key(Cursor *c) {
    const float *row = c->cache + ((int64_t)c->table[c->block] * c->bs + c->offset) * c->stride;
    if (++c->offset == c->bs) c->offset = 0, c->block++;
    return row;
}

// The scores of one head's keys j0..j0+7 (keys: their rows; past hi, the last again) into scores, lanes past hi
// at -inf; returns them.
static inline __attribute__((always_inline)) __m256 score8(const int D, const float *q, const float *const *keys,
                                                           int64_t past, float scale, float softcap,
                                                           float *scores) {
    __m256 half[2];  // keys 0-3 and 4-7, each reduced as soon as its four dots are done (fewer registers)
    for (int g = 0; g < 2; g++) {
        __m256 dots[4];
        for (int u = 0; u < 4; u++) {
            const float *k = keys[4 * g + u];
            __m256 dot = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(k));
            for (int c = 8; c < D; c += 8) dot = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(k + c), dot);
            dots[u] = dot;
        }
        half[g] = hsum4(dots);
    }
    __m256 s = _mm256_mul_ps(hsum8(half[0], half[1]), _mm256_set1_ps(scale));
    if (softcap > 0) {  // Gemma 2: softcap * tanh(s / softcap), lane by lane
        float lanes[KEYS];
        _mm256_storeu_ps(lanes, s);
        for (int u = 0; u < KEYS; u++) lanes[u] = tanhf(lanes[u] / softcap) * softcap;
        s = _mm256_loadu_ps(lanes);
    }
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    s = _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), _mm256_cmp_ps(lane, _mm256_set1_ps((float)past), _CMP_GT_OQ));
    _mm256_storeu_ps(scores, s);
    return s;
}

// R rows that share one KV head and see keys from the same lo: the G query heads of T consecutive tokens of one
// sequence, row r up to position his[r]. Each row's arithmetic is that of a row alone (its scores, then its exps
// and their sum, then its values, each in position order from lo); the rows only take turns on the same keys and
// values so that those are read from memory once and from L1 after. scores: R * (max his - lo + 1 + KEYS) floats.
static inline __attribute__((always_inline)) void attend(const int D, int R, const float *const *q,
                                                         float *const *out, const int64_t *his, const float *k_cache,
                                                         const float *v_cache, const int32_t *table, int64_t lo,
                                                         int bs, int64_t stride, float scale, float softcap,
                                                         float *scores) {
    int64_t hi = lo;
    for (int r = 0; r < R; r++) hi = his[r] > hi ? his[r] : hi;
    const int64_t pitch = hi - lo + 1 + KEYS;
    __m256 top[MAX_ROWS];
    for (int r = 0; r < R; r++) top[r] = _mm256_set1_ps(-INFINITY);
    Cursor keys = cursor(k_cache, table, lo, bs, stride);
    const float *k[KEYS] = {NULL};
    for (int64_t j0 = lo; j0 <= hi; j0 += KEYS) {
        for (int u = 0; u < KEYS; u++) k[u] = j0 + u <= hi ? next_key(&keys) : k[u - 1];
        for (int r = 0; r < R; r++) {  // lanes past a row's last key: masked to -inf, whatever they read
            if (j0 > his[r]) continue;
            const __m256 s = score8(D, q[r], k, his[r] - j0, scale, softcap, scores + r * pitch + (j0 - lo));
            top[r] = _mm256_max_ps(top[r], s);
        }
    }
    float total[MAX_ROWS];
    for (int r = 0; r < R; r++) {  // the weights, in place of the scores
        const __m256 t = _mm256_set1_ps(hmax(top[r]));
        __m256 sum = _mm256_setzero_ps();
        for (int64_t j0 = lo; j0 <= his[r]; j0 += KEYS) {
            float *e = scores + r * pitch + (j0 - lo);
            const __m256 w = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(e), t));
            sum = _mm256_add_ps(sum, w);
            _mm256_storeu_ps(e, w);
        }
        total[r] = hsum(sum);
    }
    // Values in chunks of VCHUNK keys (in L1 for every row); a row's accumulators wait in out between chunks (an
    // fp32 store and load are exact: the same chain as one pass).
    Cursor values = cursor(v_cache, table, lo, bs, stride);
    const float *v[VCHUNK];
    for (int64_t j0 = lo; j0 <= hi; j0 += VCHUNK) {
        const int n = hi - j0 + 1 < VCHUNK ? (int)(hi - j0 + 1) : VCHUNK;
        for (int u = 0; u < n; u++) v[u] = next_key(&values);
        for (int r = 0; r < R; r++) {
            if (j0 > his[r]) continue;
            const int m = his[r] - j0 + 1 < n ? (int)(his[r] - j0 + 1) : n;
            __m256 acc[MAX_D / 8];
            for (int c = 0; c < D / 8; c++) acc[c] = j0 == lo ? _mm256_setzero_ps() : _mm256_loadu_ps(out[r] + 8 * c);
            const float *e = scores + r * pitch + (j0 - lo);
            for (int u = 0; u < m; u++) {
                const __m256 w = _mm256_broadcast_ss(e + u);
                for (int c = 0; c < D / 8; c++) acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v[u] + 8 * c), acc[c]);
            }
            for (int c = 0; c < D / 8; c++) _mm256_storeu_ps(out[r] + 8 * c, acc[c]);
        }
    }
    for (int r = 0; r < R; r++) {
        const __m256 t = _mm256_set1_ps(total[r]);
        for (int c = 0; c < D / 8; c++) _mm256_storeu_ps(out[r] + 8 * c, _mm256_div_ps(_mm256_loadu_ps(out[r] + 8 * c), t));
    }
}

// Store the new tokens' K/V rows ([new, hkv * d] each) at their cache slots.
static void store_kv(const float *k, const float *v, float *k_cache, float *v_cache, const int64_t *slots,
                     int64_t new_tokens, int64_t stride) {
    for (int64_t i = 0; i < new_tokens; i++) {
        memcpy(k_cache + slots[i] * stride, k + i * stride, stride * sizeof(float));
        memcpy(v_cache + slots[i] * stride, v + i * stride, stride * sizeof(float));
    }
}

// One task: KV head kvh for the tokens first..first+count-1 of one sequence (consecutive positions). With a window
// each token sees keys from its own lo, so each is its own tile of G rows.
static void attend_tile(const float *q, float *out, const float *k_cache, const float *v_cache, int hq, int group,
                        int d, int kvh, int64_t first, int count, const int32_t *pos, const int32_t *table,
                        int bs, int64_t stride, float scale, int64_t window, float softcap, float *scores) {
    const float *kc = k_cache + (int64_t)kvh * d, *vc = v_cache + (int64_t)kvh * d;
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
        switch (d) {
            case 64: attend(64, R, qs, os, his, kc, vc, table, lo, bs, stride, scale, softcap, scores); break;
            case 128: attend(128, R, qs, os, his, kc, vc, table, lo, bs, stride, scale, softcap, scores); break;
            default: attend(d, R, qs, os, his, kc, vc, table, lo, bs, stride, scale, softcap, scores); break;
        }
    }
}

// q, out: [tokens, hq, d]; k, v: [tokens, hkv, d], stored first at slots; caches: [blocks, bs, hkv, d];
// pos: [tokens] each token's position; tiles: [num_tiles, 3] (the row of the tiles' sequence in tables, its
// first token, its token count <= MAX_ROWS / (hq / hkv)); tables: [batch, width]. A token at position p sees
// keys max(0, p - window + 1)..p (window <= 0: all); softcap <= 0: none.
// scratch: threads * MAX_ROWS * (max_len + KEYS) floats (a tile's scores per thread).
void paged_attention(const float *q, const float *k, const float *v, float *k_cache, float *v_cache,
                     const int64_t *slots, float *out, int64_t tokens, int hq, int hkv, int d, const int32_t *pos,
                     const int32_t *tiles, int64_t num_tiles, const int32_t *tables, int64_t width, int bs,
                     float scale, int64_t window, float softcap, float *scratch, int64_t max_len, int threads) {
    const int group = hq / hkv;
    const int64_t stride = (int64_t)hkv * d;
    store_kv(k, v, k_cache, v_cache, slots, tokens, stride);
    // Tiles differ in length (a long prefill's last tokens see the most keys): hand them out one at a time.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t r = 0; r < num_tiles * hkv; r++) {
        const int32_t *tile = tiles + (r / hkv) * 3;
        float *scores = scratch + (int64_t)omp_get_thread_num() * MAX_ROWS * (max_len + KEYS);
        attend_tile(q, out, k_cache, v_cache, hq, group, d, (int)(r % hkv), tile[1], tile[2], pos,
                    tables + (int64_t)tile[0] * width, bs, stride, scale, window, softcap, scores);
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
