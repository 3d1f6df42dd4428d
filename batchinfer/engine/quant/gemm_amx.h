// AMX: each panel is decoded once per call into tile rows (VNNI order), then every 16 rows of activations run
// through tdp instructions; the rows of the int32 results take the same integer and float steps as the
// AVX-512 path (gemm_avx512.h): the same bits, more rows at once.
//
// K-quants: the integer group scales are multiplied into the codes while decoding, c = sc * (u - z) (|c| < 2^13),
// split as c = 256 hi + lo (lo unsigned, hi signed), so a whole super-block sums in two tiles with K = 64 per
// instruction (tdpbsud for lo, tdpbssd for hi) and its int32 result is sum_g sc_g sum_g((u - z) q), the same
// integer the group-by-group path builds: one float step per super-block and no per-group epilogue.
// 32-types: one tdpbssd per block (K = 32, codes less their zero point) and a float step per block, the next
// block's tile computed while this one's rows are scaled.
#pragma once
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "gemm_avx512.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,amx-tile,amx-int8")

// Tile registers (the intrinsics take literal numbers). K-quants, 32 rows a step: results of rows 0-15 and
// 16-31 for the lo plane (0, 1) and the hi plane (2, 3), activations (4, 5), codes lo (6) and hi (7), each
// loaded tile used twice; 16 rows: results 0 and 2, inputs in two sets used by turns (4/6/7, 5/1/3) so a K
// step's loads need not wait for the instructions still reading the other's. 32-types: results C0/C1 and inputs
// A0/A1, B0/B1 by turns.
#define C0 0
#define C1 1
#define A0 2
#define A1 3
#define B0 4
#define B1 5

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config_t;

// Linux hands AMX state to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): 0 when granted.
static int request_amx(void) { return (int)syscall(SYS_arch_prctl, 0x1023, 18); }

// K-quants: every tile 16 x 64 bytes. 32-types: activations and codes of one block (K = 32).
static void configure_tiles(int kquant) {
    tile_config_t c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int i = 0; i < 8; i++) c.rows[i] = 16, c.colsb[i] = 64;
    if (!kquant) {
        c.colsb[A0] = c.colsb[A1] = 32;
        c.rows[B0] = c.rows[B1] = 8;
    }
    _tile_loadconfig(&c);
}

// 32-types: the codes less their zero point (u - z, signed: tdpbssd's sums need no correction), [K / 4][64].
INL void decode_codes(const int t, const uint8_t *panel, int64_t nsb, uint8_t *tiles) {
    const layout_t L = layout_of(t);
    const __m512i z = _mm512_set1_epi8((char)QT[t].z);
    for (int64_t s = 0; s < nsb; s++) {
        __m512i v[8];
        decode_group(t, panel + s * L.record_bytes + L.off_codes, v);
        for (int j = 0; j < L.vecs; j++) _mm512_storeu_si512(tiles + (s * L.vecs + j) * 64, _mm512_sub_epi8(v[j], z));
    }
}

// K-quants: one super-block's c = sc * (u - z) as lo and hi byte planes, [64][64] each (tile rows of 4 k).
// vpmaddubsw against (sc, 0) and (0, sc) byte pairs gives the even and the odd bytes' u * sc as words
// (|u * sc| <= 63 * 128: no saturation); z * sc comes off as a word; the planes are each word's low and high
// byte, put back in place by a byte blend.
INL void decode_scaled(const int t, const uint8_t *rec, uint8_t *lo, uint8_t *hi) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    const __m512i spread = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __mmask64 odd_bytes = 0xAAAAAAAAAAAAAAAAull;
    for (int g = 0; g < L.groups; g++) {
        __m512i v[8];
        decode_group(t, rec + L.off_codes + g * L.group_bytes, v);
        // channel n's scale in the four bytes of lane n, then only in the even (or the odd) byte of each pair
        const __m512i sc32 = _mm512_permutexvar_epi32(spread, _mm512_cvtepi8_epi32(kq_scales16(t, rec, g)));
        const __m512i sc8 = _mm512_and_si512(sc32, _mm512_set1_epi32(0xFF));
        const __m512i sc_even = _mm512_or_si512(sc8, _mm512_slli_epi32(sc8, 16));
        const __m512i sc_odd = _mm512_slli_epi32(sc_even, 8);
        const __m512i zsc = _mm512_mullo_epi16(_mm512_srai_epi32(_mm512_slli_epi32(sc32, 16), 16), _mm512_set1_epi16((short)q.z));
        const __m512i zw = _mm512_or_si512(_mm512_and_si512(zsc, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(zsc, 16));
        for (int j = 0; j < L.vecs; j++) {
            __m512i even = _mm512_maddubs_epi16(v[j], sc_even), odd = _mm512_maddubs_epi16(v[j], sc_odd);
            if (q.z) even = _mm512_sub_epi16(even, zw), odd = _mm512_sub_epi16(odd, zw);
            const int row = g * L.vecs + j;
            _mm512_store_si512(lo + row * 64, _mm512_mask_blend_epi8(odd_bytes, even, _mm512_slli_epi16(odd, 8)));
            _mm512_store_si512(hi + row * 64, _mm512_mask_blend_epi8(odd_bytes, _mm512_srai_epi16(even, 8), odd));
        }
    }
}

// The scaling of one step's rows (its tiles stored in los/his), done a few rows at a time between the next
// step's tile instructions: the tiles compute while these run, and the core never waits with a full window.
typedef struct {
    const uint8_t *rec;
    int64_t m0, s;
    int r, rows;
    __m512i pairs[8];
} epilogue_t;

INL void scale_rows(const int t, epilogue_t *e, int count, int32_t (*los)[16], int32_t (*his)[16], const act_t *A,
                    float *acc) {
    const int end = e->r + count < e->rows ? e->r + count : e->rows;
    for (; e->r < end; e->r++) {
        const int r = e->r;
        const __m512i isb = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(his[r]), 8), _mm512_load_si512(los[r]));
        const __m512i osb = QT[t].mins ? offset_sum(t, e->pairs, A, e->m0 + r, e->s) : _mm512_setzero_si512();
        float *a = acc + (e->m0 + r) * PANEL;
        _mm512_store_ps(a, superblock_step(t, isb, osb, 1, e->rec, A, e->m0 + r, e->s, _mm512_load_ps(a)));
    }
}

// One super-block of 32 rows from m0 (four K steps of 64) into tiles 0-3, two of the previous step's rows scaled
// after each tile instruction.
#define SCALE2 scale_rows(t, e, 2, los, his, A, acc)
INL void tdp_superblock2(const int t, const act_t *A, int64_t m0, int64_t s, const uint8_t *lo, const uint8_t *hi,
                         epilogue_t *e, int32_t (*los)[16], int32_t (*his)[16], float *acc) {
    const int8_t *x = A->q + m0 * A->K + s * QK;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int i = 0; i < 4; i++) {
        _tile_loadd(4, x + 64 * i, A->K);
        _tile_loadd(5, x + 16 * A->K + 64 * i, A->K);
        _tile_loadd(6, lo + 16 * i * 64, 64);
        _tile_loadd(7, hi + 16 * i * 64, 64);
        _tile_dpbsud(0, 4, 6);
        SCALE2;
        _tile_dpbsud(1, 5, 6);
        SCALE2;
        _tile_dpbssd(2, 4, 7);
        SCALE2;
        _tile_dpbssd(3, 5, 7);
        SCALE2;
    }
}

// One super-block of 16 rows from m0 into tiles 0 (lo) and 2 (hi), the inputs by turns.
INL void tdp_superblock1(const int t, const act_t *A, int64_t m0, int64_t s, const uint8_t *lo, const uint8_t *hi,
                         epilogue_t *e, int32_t (*los)[16], int32_t (*his)[16], float *acc) {
    const int8_t *x = A->q + m0 * A->K + s * QK;
    _tile_zero(0);
    _tile_zero(2);
    for (int i = 0; i < 4; i += 2) {
        _tile_loadd(4, x + 64 * i, A->K);
        _tile_loadd(6, lo + 16 * i * 64, 64);
        _tile_loadd(7, hi + 16 * i * 64, 64);
        _tile_dpbsud(0, 4, 6);
        SCALE2;
        _tile_dpbssd(2, 4, 7);
        SCALE2;
        _tile_loadd(5, x + 64 * (i + 1), A->K);
        _tile_loadd(1, lo + 16 * (i + 1) * 64, 64);
        _tile_loadd(3, hi + 16 * (i + 1) * 64, 64);
        _tile_dpbsud(0, 5, 1);
        SCALE2;
        _tile_dpbssd(2, 5, 3);
        SCALE2;
    }
}
#undef SCALE2

INL void store_superblock(int32_t (*los)[16], int32_t (*his)[16], int pair) {
    _tile_stored(0, los, 64);
    _tile_stored(2, his, 64);
    if (pair) {
        _tile_stored(1, los + 16, 64);
        _tile_stored(3, his + 16, 64);
    }
}

// One panel of a K-quant, all M rows: the (super-block, 32 rows) steps run in order, each step's tiles computed
// while the previous step's rows are scaled, and each super-block decoded while the last step of the one before
// computes (two decode buffers). acc: [rows padded to 32][16] floats, the rows' sums so far.
INL void kquant_panel(const int t, const act_t *A, int64_t M, const uint8_t *panel, uint8_t *planes, float *acc,
                      float *y, int64_t ldy, int ncols) {
    const layout_t L = layout_of(t);
    const int64_t nsb = A->K / QK, tiles = (M + 31) / 32, steps = nsb * tiles;
    const int pair = M > 16;  // 32 rows a step (the activations are padded to 32)
    int32_t los[32][16] __attribute__((aligned(64))), his[32][16] __attribute__((aligned(64)));
    uint8_t *lo[2] = {planes, planes + 8192}, *hi[2] = {planes + 4096, planes + 12288};
    epilogue_t e = {panel, 0, 0, 0, 0, {0}};  // nothing to scale before the first step
    memset(acc, 0, (size_t)(tiles * 32 * PANEL) * sizeof(float));
    decode_scaled(t, panel, lo[0], hi[0]);
    for (int64_t i = 0; i <= steps; i++) {  // step i's tiles, with step i - 1's rows scaled between them
        if (i > 0) store_superblock(los, his, pair);
        if (i < steps) {
            const int64_t s = i / tiles, m0 = (i % tiles) * 32;
            if (pair) tdp_superblock2(t, A, m0, s, lo[s & 1], hi[s & 1], &e, los, his, acc);
            else tdp_superblock1(t, A, m0, s, lo[s & 1], hi[s & 1], &e, los, his, acc);
            scale_rows(t, &e, 32, los, his, A, acc);  // rows left when they outnumber two per instruction
            e.rec = panel + s * L.record_bytes, e.m0 = m0, e.s = s, e.r = 0;
            e.rows = (int)(M - m0 < 32 ? M - m0 : 32);
            if (QT[t].mins) group_pairs(t, e.rec, e.pairs);
            if ((i + 1) % tiles == 0 && s + 1 < nsb)  // the next super-block, decoded while these tiles compute
                decode_scaled(t, panel + (s + 1) * L.record_bytes, lo[(s + 1) & 1], hi[(s + 1) & 1]);
        } else {
            scale_rows(t, &e, 32, los, his, A, acc);
        }
    }
    for (int64_t m = 0; m < M; m++) store_row(y + m * ldy, _mm512_load_ps(acc + m * PANEL), ncols);
}

INL void tdp_block(const act_t *A, int64_t m0, int64_t b, const uint8_t *tiles, int buf) {
    if (buf) {
        _tile_loadd(A1, A->q + m0 * A->K + 32 * b, A->K);
        _tile_loadd(B1, tiles + b * 8 * 64, 64);
        _tile_zero(C1);
        _tile_dpbssd(C1, A1, B1);
    } else {
        _tile_loadd(A0, A->q + m0 * A->K + 32 * b, A->K);
        _tile_loadd(B0, tiles + b * 8 * 64, 64);
        _tile_zero(C0);
        _tile_dpbssd(C0, A0, B0);
    }
}

INL void block_rows(const int t, const act_t *A, int64_t m0, int rows, const uint8_t *panel, const uint8_t *tiles,
                    float *y, int64_t ldy, int ncols) {
    const layout_t L = layout_of(t);
    const int64_t nb = A->K / 32;
    int32_t dots[16][16] __attribute__((aligned(64)));
    __m512 acc[16];
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    tdp_block(A, m0, 0, tiles, 0);
    for (int64_t b = 0; b < nb; b++) {
        if (b & 1) _tile_stored(C1, dots, 64);
        else _tile_stored(C0, dots, 64);
        if (b + 1 < nb) tdp_block(A, m0, b + 1, tiles, !(b & 1));
        const block_scales_t sc = block_scales(t, panel + b * L.record_bytes);
        for (int r = 0; r < rows; r++) acc[r] = block_step(t, _mm512_load_si512(dots[r]), sc, 1, A, m0 + r, b, acc[r]);
    }
    for (int r = 0; r < rows; r++) store_row(y + (m0 + r) * ldy, acc[r], ncols);
}

#pragma GCC pop_options
