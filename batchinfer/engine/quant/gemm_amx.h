// AMX: each panel is decoded once per call into tile rows (VNNI order), then every 16 rows of activations run
// through tdp instructions; the rows of the int32 results take the same integer and float steps as the
// AVX-512 path (gemm_avx512.h): the same bits, more rows at once.
//
// K-quants: the integer group scales are multiplied into the codes while decoding, c = sc * (u - z) (|c| < 2^13),
// split as c = 256 hi + lo (lo unsigned, hi signed), so a whole super-block sums in two tiles with K = 64 per
// instruction (tdpbsud for lo, tdpbssd for hi) and its int32 result is sum_g sc_g sum_g((u - z) q), the same
// integer the group-by-group path builds: one float step per super-block and no per-group epilogue.
// 32-types: one tdpbsud per block (K = 32) and a float step per block, the next block's tile computed while
// this one's rows are scaled.
#pragma once
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "gemm_avx512.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,amx-tile,amx-int8")

// Tile registers (the intrinsics take literal numbers): results C0/H0 and C1/H1 (lo and hi planes, two
// buffers), activations TA, codes TB (lo) and TH (hi).
#define C0 0
#define C1 1
#define H0 2
#define H1 3
#define TA 4
#define TB 5
#define TH 6

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config_t;

// Linux hands AMX state to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): 0 when granted.
int amx_init(void) { return (int)syscall(SYS_arch_prctl, 0x1023, 18); }

// K bytes of activations a tile row: 64 for a K-quant super-block's four steps, the block's 32 otherwise.
static void configure_tiles(int k) {
    tile_config_t c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int i = C0; i <= H1; i++) c.rows[i] = 16, c.colsb[i] = 64;
    c.rows[TA] = 16, c.colsb[TA] = (uint16_t)k;
    c.rows[TB] = c.rows[TH] = (uint8_t)(k / 4), c.colsb[TB] = c.colsb[TH] = 64;
    _tile_loadconfig(&c);
}

// 32-types: the codes as tile rows, [K / 4][64].
INL void decode_codes(const int t, const uint8_t *panel, int64_t nsb, uint8_t *tiles) {
    const layout_t L = layout_of(t);
    for (int64_t s = 0; s < nsb; s++) {
        __m512i v[8];
        decode_group(t, panel + s * L.record_bytes + L.off_codes, v);
        for (int j = 0; j < L.vecs; j++) _mm512_storeu_si512(tiles + (s * L.vecs + j) * 64, v[j]);
    }
}

// K-quants: sc * (u - z) as lo and hi byte planes, each [K / 4][64].
INL void decode_scaled(const int t, const uint8_t *panel, int64_t nsb, uint8_t *lo, uint8_t *hi) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    const __m512i pairs = _mm512_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8,
                                           7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i low = _mm512_set1_epi16(0x00FF), high = _mm512_set1_epi16((short)0xFF00), z = _mm512_set1_epi16((short)q.z);
    for (int64_t s = 0; s < nsb; s++) {
        const uint8_t *rec = panel + s * L.record_bytes;
        for (int g = 0; g < L.groups; g++) {
            __m512i v[8];
            decode_group(t, rec + L.off_codes + g * L.group_bytes, v);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(rec + L.off_sc + g * PANEL)));
            const __m512i sc = _mm512_permutexvar_epi16(pairs, _mm512_castsi256_si512(sc16));  // word w: channel w / 2
            for (int j = 0; j < L.vecs; j++) {
                const __m512i even = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_and_si512(v[j], low), z), sc);
                const __m512i odd = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_srli_epi16(v[j], 8), z), sc);
                const int64_t row = s * (q.sb / 4) + g * L.vecs + j;
                _mm512_storeu_si512(lo + row * 64, _mm512_or_si512(_mm512_and_si512(even, low), _mm512_slli_epi16(odd, 8)));
                _mm512_storeu_si512(hi + row * 64, _mm512_or_si512(_mm512_and_si512(_mm512_srai_epi16(even, 8), low),
                                                                    _mm512_and_si512(odd, high)));
            }
        }
    }
}

// Tile numbers are immediates: one branch per buffer.
#define TDP_SUPERBLOCK(C, H)                                                                      \
    do {                                                                                          \
        _tile_zero(C);                                                                            \
        _tile_zero(H);                                                                            \
        for (int i = 0; i < 4; i++) {                                                             \
            _tile_loadd(TA, A->q + m0 * K + s * QK + 64 * i, K);                                  \
            _tile_loadd(TB, lo + (s * 64 + 16 * i) * 64, 64);                                     \
            _tile_dpbsud(C, TA, TB);                                                              \
            _tile_loadd(TH, hi + (s * 64 + 16 * i) * 64, 64);                                     \
            _tile_dpbssd(H, TA, TH);                                                              \
        }                                                                                         \
    } while (0)

INL void tdp_superblock(const act_t *A, int64_t m0, int64_t s, const uint8_t *lo, const uint8_t *hi, int buf) {
    const int64_t K = A->K;
    if (buf) TDP_SUPERBLOCK(C1, H1);
    else TDP_SUPERBLOCK(C0, H0);
}

INL void kquant_rows(const int t, const act_t *A, int64_t m0, int rows, const uint8_t *panel, const uint8_t *lo,
                     const uint8_t *hi, float *y, int64_t ldy, int ncols) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    const int64_t nsb = A->K / QK;
    int32_t los[16][16] __attribute__((aligned(64))), his[16][16] __attribute__((aligned(64)));
    __m512 acc[16];
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    tdp_superblock(A, m0, 0, lo, hi, 0);
    for (int64_t s = 0; s < nsb; s++) {
        const int buf = (int)(s & 1);
        if (buf) { _tile_stored(C1, los, 64); _tile_stored(H1, his, 64); }
        else { _tile_stored(C0, los, 64); _tile_stored(H0, his, 64); }
        if (s + 1 < nsb) tdp_superblock(A, m0, s + 1, lo, hi, !buf);  // runs while these rows are scaled
        const uint8_t *rec = panel + s * L.record_bytes;
        __m512i pairs[8];
        if (q.mins) group_pairs(t, rec, pairs);
        for (int r = 0; r < rows; r++) {
            const __m512i isb = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(his[r]), 8), _mm512_load_si512(los[r]));
            const __m512i osb = q.mins ? offset_sum(t, pairs, A, m0 + r, s) : _mm512_setzero_si512();
            acc[r] = superblock_step(t, isb, osb, 1, rec, A, m0 + r, s, acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) store_row(y + (m0 + r) * ldy, acc[r], ncols);
}

INL void tdp_block(const act_t *A, int64_t m0, int64_t b, const uint8_t *tiles, int buf) {
    _tile_loadd(TA, A->q + m0 * A->K + 32 * b, A->K);
    _tile_loadd(TB, tiles + b * 8 * 64, 64);
    if (buf) { _tile_zero(C1); _tile_dpbsud(C1, TA, TB); }
    else { _tile_zero(C0); _tile_dpbsud(C0, TA, TB); }
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
        const uint8_t *rec = panel + b * L.record_bytes;
        for (int r = 0; r < rows; r++) acc[r] = block_step(t, _mm512_load_si512(dots[r]), rec, A, m0 + r, b, acc[r]);
    }
    for (int r = 0; r < rows; r++) store_row(y + (m0 + r) * ldy, acc[r], ncols);
}

#define AMX_TYPE(T) \
    static void gemm_amx_##T(const act_t *A, int64_t M, const uint8_t *w, int64_t N, float *y, int64_t ldy, int threads) { \
        const int64_t panels = (N + PANEL - 1) / PANEL, nsb = A->K / QT[T].sb;                                            \
        const int64_t bytes = nsb * layout_of(T).record_bytes;                                                            \
        _Pragma("omp parallel num_threads(threads)")                                                                      \
        {                                                                                                                 \
            uint8_t *lo = aligned_alloc(64, (size_t)(A->K * PANEL)), *hi = aligned_alloc(64, (size_t)(A->K * PANEL));     \
            configure_tiles(QT[T].kquant ? 64 : 32);                                                                      \
            _Pragma("omp for schedule(static)")                                                                           \
            for (int64_t p = 0; p < panels; p++) {                                                                        \
                const int ncols = (int)(N - p * PANEL < PANEL ? N - p * PANEL : PANEL);                                   \
                const uint8_t *panel = w + p * bytes;                                                                     \
                if (QT[T].kquant) decode_scaled(T, panel, nsb, lo, hi);                                                   \
                else decode_codes(T, panel, nsb, lo);                                                                     \
                for (int64_t m = 0; m < M; m += 16) {                                                                     \
                    const int rows = (int)(M - m < 16 ? M - m : 16);                                                      \
                    if (QT[T].kquant) kquant_rows(T, A, m, rows, panel, lo, hi, y + p * PANEL, ldy, ncols);               \
                    else block_rows(T, A, m, rows, panel, lo, y + p * PANEL, ldy, ncols);                                 \
                }                                                                                                         \
            }                                                                                                             \
            _tile_release();                                                                                              \
            free(lo);                                                                                                     \
            free(hi);                                                                                                     \
        }                                                                                                                 \
    }
AMX_TYPE(Q4_0) AMX_TYPE(Q4_1) AMX_TYPE(Q5_0) AMX_TYPE(Q5_1) AMX_TYPE(Q8_0)
AMX_TYPE(Q2_K) AMX_TYPE(Q3_K) AMX_TYPE(Q4_K) AMX_TYPE(Q5_K) AMX_TYPE(Q6_K)

static const gemm_fn GEMM_AMX[NTYPES] = {gemm_amx_Q4_0, gemm_amx_Q4_1, gemm_amx_Q5_0, gemm_amx_Q5_1, gemm_amx_Q8_0,
                                         gemm_amx_Q2_K, gemm_amx_Q3_K, gemm_amx_Q4_K, gemm_amx_Q5_K, gemm_amx_Q6_K};

#pragma GCC pop_options
