// The kernel's arithmetic, one output at a time: what every vector path must give bit for bit.
//   32-types, per block b:  isum = sum(u q) - z * sum(q)
//                           acc = fma(isum, d_w * d_x, acc)           then, with a min: acc = fma(m_w, s_x, acc)
//   K-quants, per super-block: isb = sum_g sc_g * sum_g(u q),  osb = sum_g c_g * sum_g(q)  (c = mn, or sc for z)
//                           with mins: acc = fma(isb, d_w * d_x, acc); acc = fma(osb, -(dmin_w * d_x), acc)
//                           else:      acc = fma(isb - z * osb, d_w * d_x, acc)
// Integer sums are exact, so only these float steps, in this order, fix the result.
#pragma once
#include <math.h>
#include "acts.h"
#include "repack.h"

// A vector path's first pass over a panel's records (its first tile of rows, or its decode) asks for the records
// this far ahead (the next panels', contiguous) into L2: the engine's steps read every layer's weights from memory,
// and the hardware's prefetcher alone leaves the tile waiting on them (Zen 4, 16 rows, weights beyond the L3: VNNI
// 1.2x on Q4_K and Q6_K, 1.5x on Q8_0; AVX2 1.1x; 4-16 KiB alike). Into L1 it costs (0.9x): the lines evict the
// tile's activations. always_inline: a plain inline function of prefetches, not inlined across the AVX-512
// target, is taken for one without effects and its calls are dropped (no prefetch left in the library).
#define PREFETCH_BYTES 8192

static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *rec, int bytes) {
    for (int i = 0; i < bytes; i += 64) _mm_prefetch((const char *)rec + PREFETCH_BYTES + i, _MM_HINT_T1);
}

typedef void (*gemm_fn)(const act_t *, int64_t, const uint8_t *, int64_t, float *, int64_t, int);

static inline int32_t group_qsum(const int t, const act_t *A, int64_t m, int64_t s, int g) {
    const qtype_t q = QT[t];
    if (!q.kquant) return A->bsum[m * (A->K / 32) + s];
    const int32_t *b = A->bsum + m * (A->K / 16) + s * 16;
    return q.g == 32 ? b[2 * g] + b[2 * g + 1] : b[g];
}

// The pairs of act_t: group sums of q, two groups a word (|sum| <= 32 * 128 fits int16), for vpdpwssd.
static void make_pairs(const int t, const act_t *A, int64_t M, uint32_t *out) {
    const int64_t nsb = A->K / QK;
    const int groups = QK / QT[t].g;
    for (int64_t m = 0; m < M; m++)
        for (int64_t s = 0; s < nsb; s++)
            for (int i = 0; i < 8; i++)
                out[(m * nsb + s) * 8 + i] = 2 * i + 1 >= groups ? 0 :
                    ((uint32_t)group_qsum(t, A, m, s, 2 * i) & 0xFFFF) | ((uint32_t)group_qsum(t, A, m, s, 2 * i + 1) << 16);
}

static float dot_ref(const int t, const act_t *A, int64_t m, const uint8_t *panel, int n) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    const int64_t nsb = A->K / q.sb;
    float acc = 0.0f;
    for (int64_t s = 0; s < nsb; s++) {
        block_t blk;
        unpack_column(t, panel + s * L.record_bytes, n, &blk);
        const int8_t *x = A->q + m * A->K + s * q.sb;
        const float dw = fp16_to_f32(blk.d), dx = A->d[m * nsb + s];
        if (!q.kquant) {
            int32_t isum = 0;
            for (int i = 0; i < q.sb; i++) isum += (int32_t)blk.u[i] * x[i];
            isum -= q.z * group_qsum(t, A, m, s, 0);
            acc = fmaf((float)isum, dw * dx, acc);
            if (q.mins) acc = fmaf(fp16_to_f32(blk.dm), A->s[m * nsb + s], acc);
            continue;
        }
        int32_t isb = 0, osb = 0;
        for (int g = 0; g < L.groups; g++) {
            int32_t isum = 0;
            for (int i = 0; i < q.g; i++) isum += (int32_t)blk.u[g * q.g + i] * x[g * q.g + i];
            isb += blk.sc[g] * isum;
            osb += (q.mins ? (int32_t)blk.mn[g] : (int32_t)blk.sc[g]) * group_qsum(t, A, m, s, g);
        }
        if (q.mins) {
            acc = fmaf((float)isb, dw * dx, acc);
            acc = fmaf((float)osb, -(fp16_to_f32(blk.dm) * dx), acc);
        } else {
            acc = fmaf((float)(isb - q.z * osb), dw * dx, acc);
        }
    }
    return acc;
}

static void gemm_ref(int t, const int8_t *xq, const float *xd, const float *xs, const int32_t *xbs, int64_t M, int64_t K,
              const uint8_t *w, int64_t N, float *y, int64_t ldy) {
    const act_t A = {xq, xd, xs, xbs, K, NULL};
    const int64_t panel_bytes = (K / QT[t].sb) * layout_of(t).record_bytes;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
            y[m * ldy + n] = dot_ref(t, &A, m, w + (n / PANEL) * panel_bytes, (int)(n % PANEL));
}
