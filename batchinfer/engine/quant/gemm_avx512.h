// AVX-512 VNNI: one panel of 16 channels in the 16 lanes of a register, rows in tiles of up to 8.
// A group's codes are decoded once into its VNNI vectors and reused by every row of the tile; vpdpbusd takes
// u8 codes times s8 activations broadcast 4 at a time. The float steps are gemm_ref.h's, lane by lane.
#pragma once
#include <stdlib.h>
#include "gemm_ref.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")

#define MAX_ROWS 8  // rows of a tile that decodes its panel's groups itself
#define DECODED_ROWS 6  // rows of a tile on decoded panels
#define RANGE_ROWS 128  // from these rows a range of panels is decoded whole, below a chunk of a panel at a time
#define DECODED_BYTES (16 << 10)  // a chunk of a decoded panel, in L1 while every row runs it
#define INL static inline __attribute__((always_inline))

INL void decode_group(const int t, const uint8_t *codes, __m512i *v) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    if (q.bits == 8) {
        for (int j = 0; j < L.vecs; j++) v[j] = _mm512_xor_si512(_mm512_loadu_si512(codes + 64 * j), _mm512_set1_epi8((char)0x80));
    } else if (q.bits >= 4) {
        const __m512i lo = _mm512_set1_epi8(0x0F);
        const int half = L.vecs / 2;
        for (int j = 0; j < half; j++) {
            const __m512i b = _mm512_loadu_si512(codes + 64 * j);
            v[j] = _mm512_and_si512(b, lo);
            v[j + half] = _mm512_and_si512(_mm512_srli_epi16(b, 4), lo);
        }
    } else {
        const __m512i b = _mm512_loadu_si512(codes), three = _mm512_set1_epi8(3);
        for (int j = 0; j < L.vecs; j++) v[j] = _mm512_and_si512(_mm512_srli_epi16(b, 2 * j), three);
    }
    const uint64_t *masks = (const uint64_t *)(codes + L.base_bytes);
    for (int h = 0; h < L.high_bits; h++) {
        const __m512i bit = _mm512_set1_epi8((char)(1 << ((q.bits >= 4 ? 4 : 2) + h)));
        for (int j = 0; j < L.vecs; j++) v[j] = _mm512_mask_add_epi8(v[j], (__mmask64)masks[h * L.vecs + j], v[j], bit);
    }
}

// d + codes . (x's 4 bytes broadcast), the broadcast folded into the instruction's memory operand: gcc issues a
// separate vpbroadcastd, one more uop per vpdpbusd for the front end to rename.
INL __m512i dpbusd_bcast(__m512i d, __m512i codes, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(d) : "v"(codes), "m"(*(const int32_t *)x));
    return d;
}

// Vectors j0..j1 of a group's codes against the row's activations, 4 at a time broadcast: one dependency chain.
INL __m512i dot_chain(const __m512i *v, const int8_t *x, int j0, int j1) {
    __m512i d = _mm512_setzero_si512();
    for (int j = j0; j < j1; j++) d = dpbusd_bcast(d, v[j], x + 4 * j);
    return d;
}

// A group in two chains: one chain of 8 waits on vpdpbusd's 5-cycle latency, two fill the ports. Groups of 4
// vectors (Q6_K, Q3_K, Q2_K) in tiles of 4 rows or more take one chain: the rows' chains fill the ports, and the
// add saved is one op in 7 (Q6_K 1.05x on Zen 4; groups of 8 in one chain were 0.92-1.0x).
INL __m512i group_dot(const int R, const int vecs, const __m512i *v, const int8_t *x) {
    if (R >= 4 && vecs <= 4) return dot_chain(v, x, 0, vecs);
    return _mm512_add_epi32(dot_chain(v, x, 0, vecs / 2), dot_chain(v, x, vecs / 2, vecs));
}

// K-quants: isb + sc * (the group's dot). Where chunks of two or more vectors have sums that fit int16 (|q| <=
// 128: Q4_K four, Q5_K two), each chunk's dot is taken times sc by vpdpwssd against (sc, 0) word pairs: on an
// Intel Xeon 1.07-1.17x on Q4_K against vpmulld on the whole dot (two uops on one port, 10 cycles, every group of
// every row). Zen 4's vpmulld is one pipelined uop: there `mul` (the path VNNI_MUL) takes it, Q4_K 1.05-1.15x and
// Q5_K 1.17-1.31x against the chunks. Q6_K's chunks would be single vectors: one vpdpwssd each cost more than its one
// vpmulld (0.96x), so it keeps that on both.
INL __m512i scaled_dot(const int t, const int mul, const int R, const __m512i *v, const int8_t *x, __m512i sc, __m512i isb) {
    const int vecs = layout_of(t).vecs, chunk = 32767 / (4 * ((1 << QT[t].bits) - 1) * 128);
    if (chunk < 2 || mul) return _mm512_add_epi32(isb, _mm512_mullo_epi32(group_dot(R, vecs, v, x), sc));
    const __m512i sc16 = _mm512_and_si512(sc, _mm512_set1_epi32(0xFFFF));
    for (int j0 = 0; j0 < vecs; j0 += chunk)
        isb = _mm512_dpwssd_epi32(isb, dot_chain(v, x, j0, j0 + chunk < vecs ? j0 + chunk : vecs), sc16);
    return isb;
}

INL __m512 load_fp16x16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

// 32-types: a block's weight scales (d_w, and m_w for a min) for the 16 channels, loaded once for all its rows.
typedef struct {
    __m512 d, m;
} block_scales_t;

INL block_scales_t block_scales(const int t, const uint8_t *rec) {
    block_scales_t sc = {load_fp16x16(rec), _mm512_setzero_ps()};
    if (QT[t].mins) sc.m = load_fp16x16(rec + layout_of(t).off_dm);
    return sc;
}

// One row's block dot (int32 per channel) into acc; `folded`: the zero point's share is already out of dot.
INL __m512 block_step(const int t, __m512i dot, block_scales_t sc, int folded, const act_t *A, int64_t m, int64_t b,
                      __m512 acc) {
    const qtype_t q = QT[t];
    const int64_t i = m * (A->K / 32) + b;
    if (q.z && !folded) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(q.z * A->bsum[i]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sc.d, _mm512_set1_ps(A->d[i])), acc);
    if (q.mins) acc = _mm512_fmadd_ps(sc.m, _mm512_set1_ps(A->s[i]), acc);
    return acc;
}

// K-quants: sum over groups of c_g * sum_g(q) (c the mins, or the scales for the zero point), in int32: per
// lane a pair of groups' c as int16 (|c| < 128, |sum_g(q)| <= 4096), one vpdpwssd per pair.
INL void group_pairs(const int t, const uint8_t *rec, __m512i *pairs) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    for (int i = 0; i < L.groups / 2; i++) {
        const __m128i a = kq_offsets16(t, rec, 2 * i);
        const __m128i b = kq_offsets16(t, rec, 2 * i + 1);
        const __m512i lo = q.mins ? _mm512_cvtepu8_epi32(a) : _mm512_cvtepi8_epi32(a);
        const __m512i hi = q.mins ? _mm512_cvtepu8_epi32(b) : _mm512_cvtepi8_epi32(b);
        pairs[i] = _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(hi, 16));
    }
}

INL __m512i offset_sum(const int t, const __m512i *pairs, const act_t *A, int64_t m, int64_t s) {
    const uint32_t *sums = A->pairs + (m * (A->K / QK) + s) * 8;
    __m512i osb = _mm512_setzero_si512();
    for (int i = 0; i < layout_of(t).groups / 2; i++) osb = _mm512_dpwssd_epi32(osb, pairs[i], _mm512_set1_epi32((int)sums[i]));
    return osb;
}

// K-quants: one super-block's integer sums into acc. isb = sum_g sc_g sum_g(u q); osb = offset_sum; a zero
// point's share (z * osb) already taken out of isb where `folded` (the AMX path's codes carry it).
INL __m512 superblock_step(const int t, __m512i isb, __m512i osb, int folded, const uint8_t *rec, const act_t *A,
                           int64_t m, int64_t s, __m512 acc) {
    const qtype_t q = QT[t];
    const __m512 dx = _mm512_set1_ps(A->d[m * (A->K / QK) + s]);
    const __m512 scale = _mm512_mul_ps(load_fp16x16(rec), dx);
    if (q.mins) {
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isb), scale, acc);
        const __m512 dmin = _mm512_mul_ps(load_fp16x16(rec + layout_of(t).off_dm), dx);
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(osb), _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(dmin), _mm512_set1_epi32((int)0x80000000))), acc);
    }
    if (!folded) isb = _mm512_sub_epi32(isb, _mm512_mullo_epi32(osb, _mm512_set1_epi32(q.z)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isb), scale, acc);
}

INL __m512i group_scales(const int t, const uint8_t *rec, int g) {
    return _mm512_cvtepi8_epi32(kq_scales16(t, rec, g));
}

INL int panel_cols(int64_t N, int64_t p) { return (int)(N - p * PANEL < PANEL ? N - p * PANEL : PANEL); }

INL void store_row(float *y, __m512 acc, int ncols) {
    if (ncols == PANEL) _mm512_storeu_ps(y, acc);
    else _mm512_mask_storeu_ps(y, (__mmask16)((1u << ncols) - 1), acc);
}

// A record decoded for the row tiles: its groups' VNNI vectors, then (K-quants) each group's scales as int32
// lanes and the pairs of group_pairs. Vectors a record takes:
INL int decoded_vecs(const int t) {
    const layout_t L = layout_of(t);
    return L.groups * L.vecs + (QT[t].kquant ? L.groups + L.groups / 2 : 0);
}

INL void decode_panel(const int t, const uint8_t *panel, int64_t nsb, __m512i *out) {
    const layout_t L = layout_of(t);
    for (int64_t s = 0; s < nsb; s++, out += decoded_vecs(t)) {
        const uint8_t *rec = panel + s * L.record_bytes;
        prefetch_ahead(rec, L.record_bytes);
        for (int g = 0; g < L.groups; g++) decode_group(t, rec + L.off_codes + g * L.group_bytes, out + g * L.vecs);
        if (!QT[t].kquant) continue;
        for (int g = 0; g < L.groups; g++) out[L.groups * L.vecs + g] = group_scales(t, rec, g);
        group_pairs(t, rec, out + L.groups * L.vecs + L.groups);
    }
}

// Rows m0..m0+R of one panel (its records from `panel`), superblocks s0..s1, into y (ldy apart), ncols of its 16
// channels: from zero where s0 is 0, else from the sums of the earlier superblocks that y holds (a float stored
// and loaded is exact: the same sums in the same order as one pass). `dec`: superblocks s0..s1 decoded
// (decode_panel), or NULL to decode each group here.
INL void panel_rows(const int t, const int mul, const int R, const act_t *A, int64_t m0, const uint8_t *panel,
                    const __m512i *dec, int64_t s0, int64_t s1, float *y, int64_t ldy, int ncols) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    const int64_t K = A->K;
    const __mmask16 cols = (__mmask16)((1u << ncols) - 1);
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < R; r++) acc[r] = s0 ? _mm512_maskz_loadu_ps(cols, y + (m0 + r) * ldy) : _mm512_setzero_ps();
    for (int64_t s = s0; s < s1; s++) {
        const uint8_t *rec = panel + s * L.record_bytes;
        const __m512i *d = dec ? dec + (s - s0) * decoded_vecs(t) : NULL;
        if (!d && m0 == 0) prefetch_ahead(rec, L.record_bytes);
        __m512i isb[MAX_ROWS];
        for (int r = 0; r < R; r++) isb[r] = _mm512_setzero_si512();
        for (int g = 0; g < L.groups; g++) {
            __m512i own[8];
            const __m512i *v = d ? d + g * L.vecs : own;
            if (!d) decode_group(t, rec + L.off_codes + g * L.group_bytes, own);
            const __m512i sc = !q.kquant ? _mm512_setzero_si512() : d ? d[L.groups * L.vecs + g] : group_scales(t, rec, g);
            const block_scales_t bs = q.kquant ? (block_scales_t){} : block_scales(t, rec);
            for (int r = 0; r < R; r++) {
                const int8_t *x = A->q + (m0 + r) * K + s * q.sb + g * q.g;
                if (q.kquant) isb[r] = scaled_dot(t, mul, R, v, x, sc, isb[r]);
                else acc[r] = block_step(t, group_dot(R, L.vecs, v, x), bs, 0, A, m0 + r, s, acc[r]);
            }
        }
        if (q.kquant) {
            __m512i own[8];
            const __m512i *pairs = d ? d + L.groups * L.vecs + L.groups : own;
            if (!d) group_pairs(t, rec, own);
            for (int r = 0; r < R; r++)
                acc[r] = superblock_step(t, isb[r], offset_sum(t, pairs, A, m0 + r, s), 0, rec, A, m0 + r, s, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) store_row(y + (m0 + r) * ldy, acc[r], ncols);
}

// Rows m0..m1 of panels p0..p1 in tiles of R, tile by tile across the panels: a tile's activations are read by
// every panel of the range from L1, and the range's weights (sized to L2 by the caller) by every tile.
INL void row_tiles(const int t, const int mul, const int R, const act_t *A, int64_t m0, int64_t m1, const uint8_t *w,
                   int64_t p0, int64_t p1, int64_t N, const __m512i *dec, float *y, int64_t ldy) {
    const int64_t nsb = A->K / QT[t].sb, bytes = nsb * layout_of(t).record_bytes, nvec = nsb * decoded_vecs(t);
    for (int64_t m = m0; m + R <= m1; m += R)
        for (int64_t p = p0; p < p1; p++)
            panel_rows(t, mul, R, A, m, w + p * bytes, dec ? dec + (p - p0) * nvec : NULL, 0, nsb, y + p * PANEL, ldy,
                       panel_cols(N, p));
}

// Rows m..M of superblocks s0..s1 of one panel, decoded (dec): in tiles of 6, the rest in tiles of 4, 2 and 1.
INL void decoded_tiles(const int t, const int mul, const act_t *A, int64_t m, int64_t M, const uint8_t *panel,
                       const __m512i *dec, int64_t s0, int64_t s1, float *y, int64_t ldy, int ncols) {
    for (; m + DECODED_ROWS <= M; m += DECODED_ROWS)
        panel_rows(t, mul, DECODED_ROWS, A, m, panel, dec, s0, s1, y, ldy, ncols);
    if (M - m >= 4) panel_rows(t, mul, 4, A, m, panel, dec, s0, s1, y, ldy, ncols), m += 4;
    if (M - m >= 2) panel_rows(t, mul, 2, A, m, panel, dec, s0, s1, y, ldy, ncols), m += 2;
    if (M - m == 1) panel_rows(t, mul, 1, A, m, panel, dec, s0, s1, y, ldy, ncols);
}

// A thread's scratch for decoded panels, kept between calls (OpenMP's threads live on).
static __m512i *scratch(int64_t vecs) {
    static __thread __m512i *buf;
    static __thread int64_t cap;
    if (vecs > cap) {
        free(buf);
        buf = aligned_alloc(64, (size_t)vecs * 64);
        cap = buf ? vecs : 0;
    }
    return buf;
}

// Panels p0..p1 of w over all M rows. Below 24 rows each tile of 8 decodes the groups it runs (16 rows: two
// decodes, not three). Up to RANGE_ROWS, each panel is decoded a chunk of superblocks at a time (about
// DECODED_BYTES, in L1) that every row runs before the next (32-96 rows: 1.02-1.43x against the range below, two
// alternating runs). From RANGE_ROWS, the range's panels are decoded whole (about 1 MiB, in L2) and the tiles of
// 6 walk them tile by tile (620 rows: 1.0-1.15x against the chunks, which stream every row's activations per
// panel); the last rows decode as they go.
INL void panels_vnni(const int t, const int mul, const act_t *A, int64_t M, const uint8_t *w, int64_t p0, int64_t p1,
                     int64_t N, float *y, int64_t ldy) {
    const int64_t nsb = A->K / QT[t].sb, bytes = nsb * layout_of(t).record_bytes, nvec = nsb * decoded_vecs(t);
    int64_t m = 0;
    if (M >= 4 * DECODED_ROWS && M < RANGE_ROWS) {
        const int64_t fit = DECODED_BYTES / (decoded_vecs(t) * 64), per = fit > 0 ? fit : 1;  // superblocks a chunk
        __m512i *dec = scratch(per * decoded_vecs(t));
        for (int64_t p = p0; p < p1; p++)
            for (int64_t s0 = 0; s0 < nsb; s0 += per) {
                const int64_t s1 = s0 + per < nsb ? s0 + per : nsb;
                decode_panel(t, w + p * bytes + s0 * layout_of(t).record_bytes, s1 - s0, dec);
                decoded_tiles(t, mul, A, 0, M, w + p * bytes, dec, s0, s1, y + p * PANEL, ldy, panel_cols(N, p));
            }
        return;
    }
    if (M >= RANGE_ROWS) {
        __m512i *dec = scratch((p1 - p0) * nvec);
        for (int64_t p = p0; p < p1; p++) decode_panel(t, w + p * bytes, nsb, dec + (p - p0) * nvec);
        m = M / DECODED_ROWS * DECODED_ROWS;
        row_tiles(t, mul, DECODED_ROWS, A, 0, m, w, p0, p1, N, dec, y, ldy);
    } else {
        m = M / MAX_ROWS * MAX_ROWS;
        row_tiles(t, mul, MAX_ROWS, A, 0, m, w, p0, p1, N, NULL, y, ldy);
    }
    if (M - m >= 4) row_tiles(t, mul, 4, A, m, m + 4, w, p0, p1, N, NULL, y, ldy), m += 4;
    if (M - m >= 2) row_tiles(t, mul, 2, A, m, m + 2, w, p0, p1, N, NULL, y, ldy), m += 2;
    if (M - m == 1) row_tiles(t, mul, 1, A, m, m + 1, w, p0, p1, N, NULL, y, ldy);
}

// Panels a range takes: about 1 MiB decoded (half the L2), and ranges a multiple of the threads (static schedule).
static inline int64_t panels_per_range(int64_t decoded_bytes, int64_t panels, int threads) {
    const int64_t fit = (1 << 20) / decoded_bytes > 0 ? (1 << 20) / decoded_bytes : 1;
    const int64_t ranges = ((panels + fit - 1) / fit + threads - 1) / threads * threads;
    return (panels + ranges - 1) / ranges;
}

#pragma GCC pop_options
