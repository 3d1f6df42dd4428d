// AVX2 (no VNNI): each panel in two halves of 8 channels, rows in tiles of up to 6. Each code vector is decoded
// once for the tile's rows (the high-bit masks cost a dozen uops a vector here, not one as in AVX-512). A group's
// products are vpmaddubsw pairs (u8 codes x s8 activations; |pair| <= 2 * 63 * 128 for codes up to 6 bits),
// summed in int16 as far as exact (chain16), then to int32 by vpmaddwd; Q8_0's signed codes go through the sign
// trick (|q| x sign(x, q)), giving sum(q x) directly, the integer the other paths reach as sum(u x) - 128 sum(x).
// Float steps as gemm_ref.h. Zen 3, against 3-row tiles each decoding its own codes: Q4_K 1.3-1.4x, Q6_K 1.4-1.5x.
#pragma once
#include "gemm_ref.h"

#define AVX2_ROWS 6
#define INL2 static inline __attribute__((always_inline))

// How many vpmaddubsw results a dot adds in int16 before vpmaddwd widens them: a pair is at most 2 * umax * 128
// (umax the largest code; Q8_0's |q| <= 128 against |x| <= 127), so this many sum exactly. Zen 3 issues both
// multiplies on the same two pipes: one vpmaddwd a chain, not one a vector, nearly halves their uops (4-bit: 8 to 1).
INL2 int chain16(const int t) { return 32767 / (2 * ((QT[t].bits == 8 ? 128 : 1 << QT[t].bits) - 1) * 128); }

// Vector j's half h (channels 8h..8h+7) of a group, as u8 codes (Q8_0: its signed q).
INL2 __m256i decode_vec(const int t, const uint8_t *codes, int h, int j) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    if (q.bits == 8) return _mm256_loadu_si256((const __m256i *)(codes + 64 * j + 32 * h));
    __m256i v;
    if (q.bits >= 4) {
        const int half = L.vecs / 2;
        const __m256i b = _mm256_loadu_si256((const __m256i *)(codes + 64 * (j % half) + 32 * h));
        v = _mm256_and_si256(j < half ? b : _mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0F));
    } else {
        const __m256i b = _mm256_loadu_si256((const __m256i *)(codes + 32 * h));
        v = _mm256_and_si256(_mm256_srli_epi16(b, 2 * j), _mm256_set1_epi8(3));
    }
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const uint64_t *masks = (const uint64_t *)(codes + L.base_bytes);
    for (int hb = 0; hb < L.high_bits; hb++) {
        const __m256i add = _mm256_set1_epi8((char)(1 << ((q.bits >= 4 ? 4 : 2) + hb)));
        const __m256i m = _mm256_shuffle_epi8(_mm256_set1_epi32((int)(uint32_t)(masks[hb * L.vecs + j] >> (32 * h))), spread);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(m, bits), bits);
        v = _mm256_add_epi8(v, _mm256_and_si256(set, add));
    }
    return v;
}

// R rows' dots with a group (rows K apart from x), each lane's int16 halves weighted by `mul`; every vector is
// decoded once for the R rows.
INL2 void group_dots2(const int t, const int R, const uint8_t *codes, int h, const int8_t *x, int64_t K, const __m256i mul,
                      __m256i *d) {
    const int vecs = layout_of(t).vecs, chain = chain16(t) < vecs ? chain16(t) : vecs;  // chain divides vecs
#pragma GCC unroll 16
    for (int j0 = 0; j0 < vecs; j0 += chain) {
        __m256i p16[AVX2_ROWS];
#pragma GCC unroll 16
        for (int j = j0; j < j0 + chain; j++) {
            const __m256i v = decode_vec(t, codes, h, j);
            const __m256i u = QT[t].bits == 8 ? _mm256_sign_epi8(v, v) : v;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                int32_t four;
                memcpy(&four, x + r * K + 4 * j, 4);
                const __m256i xb = _mm256_set1_epi32(four);
                const __m256i p = _mm256_maddubs_epi16(u, QT[t].bits == 8 ? _mm256_sign_epi8(xb, v) : xb);
                p16[r] = j == j0 ? p : _mm256_add_epi16(p16[r], p);
                __asm__("" : "+x"(p16[r]));  // keeps gcc from hoisting every product first (and spilling them)
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m256i w = _mm256_madd_epi16(p16[r], mul);
            d[r] = j0 == 0 ? w : _mm256_add_epi32(d[r], w);
        }
    }
}

INL2 __m256 load_fp16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

INL2 __m256 block_step2(const int t, __m256i dot, const uint8_t *rec, int h, const act_t *A, int64_t m, int64_t b, __m256 acc) {
    const qtype_t q = QT[t];
    const int64_t nb = A->K / 32;
    if (q.z && q.bits != 8) dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(q.z * A->bsum[m * nb + b]));
    const __m256 scale = _mm256_mul_ps(load_fp16x8(rec + 16 * h), _mm256_set1_ps(A->d[m * nb + b]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc);
    if (q.mins) acc = _mm256_fmadd_ps(load_fp16x8(rec + layout_of(t).off_dm + 16 * h), _mm256_set1_ps(A->s[m * nb + b]), acc);
    return acc;
}

// Each lane's low int16 from lo's lane, its high from hi's (vpmaddwd's operand of two int16 a lane).
INL2 __m256i int16_pairs(__m256i lo, __m256i hi) {
    return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(hi, 16));
}

// Channels 8h..8h+7 of 16 bytes, in the low 8.
INL2 __m128i half_of(__m128i v, int h) { return h ? _mm_unpackhi_epi64(v, v) : v; }

// Rows m0..m0+R-1's offset sums of a super-block: each lane's group offsets decoded once for the R rows, paired
// two groups a lane against each row's pairs of group sums of q (act_t pairs) by vpmaddwd.
INL2 void offset_sums2(const int t, const int R, const uint8_t *rec, int h, const act_t *A, int64_t m0, int64_t s,
                       __m256i *osb) {
    const qtype_t q = QT[t];
    const int64_t nsb = A->K / QK;
    for (int r = 0; r < R; r++) osb[r] = _mm256_setzero_si256();
    for (int i = 0; i < layout_of(t).groups / 2; i++) {
        const __m128i a = half_of(kq_offsets16(t, rec, 2 * i), h);
        const __m128i b = half_of(kq_offsets16(t, rec, 2 * i + 1), h);
        const __m256i lo = q.mins ? _mm256_cvtepu8_epi32(a) : _mm256_cvtepi8_epi32(a);
        const __m256i hi = q.mins ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b);
        const __m256i pair = int16_pairs(lo, hi);
        for (int r = 0; r < R; r++) {
            const uint32_t two = A->pairs[((m0 + r) * nsb + s) * 8 + i];
            osb[r] = _mm256_add_epi32(osb[r], _mm256_madd_epi16(pair, _mm256_set1_epi32((int)two)));
        }
    }
}

INL2 __m256 superblock_step2(const int t, __m256i isb, __m256i osb, const uint8_t *rec, int h, const act_t *A, int64_t m,
                             int64_t s, __m256 acc) {
    const qtype_t q = QT[t];
    const __m256 dx = _mm256_set1_ps(A->d[m * (A->K / QK) + s]);
    const __m256 scale = _mm256_mul_ps(load_fp16x8(rec + 16 * h), dx);
    if (q.mins) {
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isb), scale, acc);
        const __m256 dmin = _mm256_mul_ps(load_fp16x8(rec + layout_of(t).off_dm + 16 * h), dx);
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(osb), _mm256_xor_ps(dmin, _mm256_set1_ps(-0.0f)), acc);
    }
    isb = _mm256_sub_epi32(isb, _mm256_mullo_epi32(osb, _mm256_set1_epi32(q.z)));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isb), scale, acc);
}

INL2 void store_half(float *y, __m256 acc, int ncols) {
    if (ncols >= 8) {
        _mm256_storeu_ps(y, acc);
        return;
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, acc);
    memcpy(y, tmp, sizeof(float) * (size_t)(ncols > 0 ? ncols : 0));
}

INL2 void half_rows(const int t, const int R, const act_t *A, int64_t m0, const uint8_t *panel, int h, float *y, int64_t ldy, int ncols) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    const int64_t K = A->K, nsb = K / q.sb;
    __m256 acc[AVX2_ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *rec = panel + s * L.record_bytes;
        if (m0 == 0 && h == 0) prefetch_ahead(rec, L.record_bytes);
        __m256i isb[AVX2_ROWS];
        for (int r = 0; r < R; r++) isb[r] = _mm256_setzero_si256();
        for (int g = 0; g < L.groups; g++) {
            __m256i mul = _mm256_set1_epi16(1);
            if (q.kquant) {  // each lane's scale in both int16 halves
                const __m256i sc = _mm256_cvtepi8_epi32(half_of(kq_scales16(t, rec, g), h));
                mul = int16_pairs(sc, sc);
            }
            __m256i dot[AVX2_ROWS];
            group_dots2(t, R, rec + L.off_codes + g * L.group_bytes, h, A->q + m0 * K + s * q.sb + g * q.g, K, mul, dot);
            for (int r = 0; r < R; r++) {
                if (q.kquant) isb[r] = _mm256_add_epi32(isb[r], dot[r]);
                else acc[r] = block_step2(t, dot[r], rec, h, A, m0 + r, s, acc[r]);
            }
        }
        if (q.kquant) {
            __m256i osb[AVX2_ROWS];
            offset_sums2(t, R, rec, h, A, m0, s, osb);
            for (int r = 0; r < R; r++) acc[r] = superblock_step2(t, isb[r], osb[r], rec, h, A, m0 + r, s, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) store_half(y + (m0 + r) * ldy + 8 * h, acc[r], ncols - 8 * h);
}

INL2 void panel_avx2(const int t, const act_t *A, int64_t M, const uint8_t *panel, float *y, int64_t ldy, int ncols) {
    for (int h = 0; h < 2 && 8 * h < ncols; h++) {
        int64_t m = 0;
        for (; m + AVX2_ROWS <= M; m += AVX2_ROWS) half_rows(t, AVX2_ROWS, A, m, panel, h, y, ldy, ncols);
        switch (M - m) {  // the rest (under AVX2_ROWS), each count its own unrolled code
#define REST(n) case n: half_rows(t, n, A, m, panel, h, y, ldy, ncols); break;
            REST(1) REST(2) REST(3) REST(4) REST(5)
#undef REST
        }
    }
}

#define AVX2_TYPE(T) \
    static void gemm_avx2_##T(const act_t *A, int64_t M, const uint8_t *w, int64_t N, float *y, int64_t ldy, int threads) { \
        const int64_t panels = (N + PANEL - 1) / PANEL, bytes = (A->K / QT[T].sb) * layout_of(T).record_bytes;               \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")                                                  \
        for (int64_t p = 0; p < panels; p++)                                                                               \
            panel_avx2(T, A, M, w + p * bytes, y + p * PANEL, ldy, (int)(N - p * PANEL < PANEL ? N - p * PANEL : PANEL)); \
    }
AVX2_TYPE(Q4_0) AVX2_TYPE(Q4_1) AVX2_TYPE(Q5_0) AVX2_TYPE(Q5_1) AVX2_TYPE(Q8_0)
AVX2_TYPE(Q2_K) AVX2_TYPE(Q3_K) AVX2_TYPE(Q4_K) AVX2_TYPE(Q5_K) AVX2_TYPE(Q6_K)

static const gemm_fn GEMM_AVX2[NTYPES] = {
    BUILT_ON(1, Q4_0, gemm_avx2_Q4_0), BUILT_ON(1, Q4_1, gemm_avx2_Q4_1), BUILT_ON(1, Q5_0, gemm_avx2_Q5_0),
    BUILT_ON(1, Q5_1, gemm_avx2_Q5_1), BUILT_ON(1, Q8_0, gemm_avx2_Q8_0), BUILT_ON(1, Q2_K, gemm_avx2_Q2_K),
    BUILT_ON(1, Q3_K, gemm_avx2_Q3_K), BUILT_ON(1, Q4_K, gemm_avx2_Q4_K), BUILT_ON(1, Q5_K, gemm_avx2_Q5_K),
    BUILT_ON(1, Q6_K, gemm_avx2_Q6_K)
};
