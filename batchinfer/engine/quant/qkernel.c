// The integer kernel over GGUF's block types: repack, de-quantize, quantize activations, and the GEMM
// y[M, N] = x[M, K] @ W[N, K]^T with W packed (qtypes.h) and x quantized per row (acts.h).
// Paths, chosen per call: 0 the scalar reference, 1 AVX2, 2 AVX-512 VNNI, 3 AMX, 4 VNNI_MUL (VNNI with K-quant
// scales by vpmulld); all give the same bits.
// Built with AVX2 flags, in three units compiled side by side (this one, qkernel_avx512.c, qkernel_amx.c); the
// AVX-512 and AMX code carries its own target, so one library serves every CPU.
#include <stdlib.h>
#include "gemm_avx2.h"

extern const gemm_fn GEMM_VNNI[NTYPES], GEMM_AMX[NTYPES], GEMM_VNNI_MUL[NTYPES];

int64_t packed_bytes(int t, int64_t n, int64_t k) { return packed_bytes_of(t, n, k); }

void repack(int t, const uint8_t *raw, int64_t row_bytes, int64_t N, int64_t K, const int64_t *rows, uint8_t *out,
            int threads) {
    repack_rows(t, raw, row_bytes, N, K, rows, out, threads);
}

void dequant_rows(int t, const uint8_t *raw, int64_t row_bytes, int64_t K, const int64_t *ids, int64_t n_ids,
                  float *out, int threads) {
    dequant_gguf_rows(t, raw, row_bytes, K, ids, n_ids, out, threads);
}

void dequant_packed(int t, const uint8_t *w, int64_t N, int64_t K, float *out) { dequant_panels(t, w, N, K, out); }

void quantize_acts(int t, const float *x, int64_t ldx, int64_t M, int64_t K, int64_t rows_padded, int8_t *q, float *d,
                   float *s, int32_t *bsum, int threads) {
    quantize_rows(t, x, ldx, M, K, rows_padded, q, d, s, bsum, threads);
}

// AMX rows a call: every panel reads all of its rows' activations, so a call's rows are kept within L2 (256 rows
// of K = 8192 is 2 MiB); each chunk decodes the panels again, a small cost against 256 rows of tiles.
#define AMX_CHUNK_ROWS 256

// The activations of rows m0.. of A (the same arrays, offset).
static act_t rows_from(const int t, const act_t *A, int64_t m0) {
    const int64_t K = A->K, nd = K / QT[t].sb, nb = K / (QT[t].kquant ? 16 : 32);
    act_t sub = {A->q + m0 * K, A->d + m0 * nd, A->s + (QT[t].kquant ? 0 : m0 * (K / 32)), A->bsum + m0 * nb, K,
                 A->pairs ? A->pairs + m0 * (K / QK) * 8 : NULL};
    return sub;
}

void gemm(int t, const int8_t *xq, const float *xd, const float *xs, const int32_t *xbs, int64_t M, int64_t K,
          const uint8_t *w, int64_t N, float *y, int64_t ldy, int path, int threads) {
    uint32_t *pairs = QT[t].kquant ? malloc((size_t)(M * (K / QK) * 8) * sizeof(uint32_t)) : NULL;
    const act_t A = {xq, xd, xs, xbs, K, pairs};
    if (pairs) make_pairs(t, &A, M, pairs);
    const gemm_fn *table = path == 4 ? GEMM_VNNI_MUL : path == 3 ? GEMM_AMX : path == 2 ? GEMM_VNNI : GEMM_AVX2;
    if (path > 0 && !table[t]) path = 0;  // a type this build left out: the reference (kernel.py never asks it)
    if (path == 3)
        for (int64_t m0 = 0; m0 < M; m0 += AMX_CHUNK_ROWS) {
            const act_t sub = rows_from(t, &A, m0);
            GEMM_AMX[t](&sub, M - m0 < AMX_CHUNK_ROWS ? M - m0 : AMX_CHUNK_ROWS, w, N, y + m0 * ldy, ldy, threads);
        }
    else if (path == 2 || path == 4) table[t](&A, M, w, N, y, ldy, threads);
    else if (path == 1) GEMM_AVX2[t](&A, M, w, N, y, ldy, threads);
    else gemm_ref(t, xq, xd, xs, xbs, M, K, w, N, y, ldy);
    free(pairs);
}

// A scheme's activations (K-quants' Q8_K, the 32-types' Q8_0/Q8_1) in the calling thread's scratch, kept between
// calls and grown as needed: q padded to a multiple of 32 rows (AMX tiles), d, s and bsum as quantize_rows fills.
typedef struct {
    void *buf[4];
    size_t cap[4];
} scratch_t;

static void *room(scratch_t *sc, int i, size_t bytes) {
    bytes = bytes ? (bytes + 63) / 64 * 64 : 64;  // a call of no rows still gets a buffer (aligned_alloc of 0 may fail)
    if (bytes > sc->cap[i]) {
        free(sc->buf[i]);
        sc->buf[i] = aligned_alloc(64, bytes);
        sc->cap[i] = sc->buf[i] ? bytes : 0;
    }
    return sc->buf[i];
}

// One projection's parts (q, k, v; gate, up; each its own block type) into column ranges of y: x quantized once a
// scheme, then each part's GEMM on its path. One foreign call a projection, where StackedWeight made two or more
// and four torch tensors (a decode step makes a few hundred). Returns -1 where the scratch cannot be had.
int linear(int nparts, const int32_t *types, const uint8_t *const *ws, const int64_t *ns, const int32_t *paths,
           const float *x, int64_t ldx, int64_t M, int64_t K, float *y, int64_t ldy, int threads) {
    static __thread scratch_t scratch[2];
    int quantized[2] = {0, 0};
    const int64_t padded = (M + 31) / 32 * 32;
    for (int i = 0; i < nparts; i++) {
        const int t = types[i], kq = QT[t].kquant, sb = QT[t].sb;
        scratch_t *sc = &scratch[kq];
        int8_t *q = room(sc, 0, (size_t)(padded * K));
        float *d = room(sc, 1, (size_t)(M * (K / sb)) * sizeof(float));
        float *sm = room(sc, 2, (size_t)(M * (kq ? 1 : K / 32)) * sizeof(float));
        int32_t *bsum = room(sc, 3, (size_t)(M * (K / (kq ? 16 : 32))) * sizeof(int32_t));
        if (!q || !d || !sm || !bsum) return -1;
        if (!quantized[kq]) quantize_rows(t, x, ldx, M, K, padded, q, d, sm, bsum, threads), quantized[kq] = 1;
        gemm(t, q, d, sm, bsum, M, K, ws[i], ns[i], y, ldy, paths[i], threads);
        y += ns[i];
    }
    return 0;
}
