// One ISA's attention tile (cpu_kernel.c includes this twice: AVX2 and AVX-512), written on VF, a vector of 16
// float lanes (one AVX-512 register, two AVX2 ones), through V(op). Both builds do the same arithmetic lane by
// lane, so a token gets the same bits on every CPU.
//
// R rows share one KV head and see keys from the same lo: the G query heads of T consecutive tokens of one
// sequence, row r up to position his[r]. Row r's arithmetic:
//   score of key j: q[0] * k[0], then fma(q[c], k[c], .) for c = 1..D-1 in order; times scale; the softcap;
//   weights: exp(score - the row's max), summed in 16 lane partials (lane = j mod 16, in position order), then a
//   fixed tree over the lanes;
//   out[c] = (0 + w_lo * v_lo[c] + ... + w_hi * v_hi[c], each an fma in position order) / the sum.
// The rows are grouped by four (RG) only to share each load; keys past a row's last position get weight exactly
// 0 (their fma leaves the sum's bits alone), so a row computed beside later tokens gets its bits alone.
// The build sets NV, the key vectors a row's scores take at once (RG * NV FMA chains in flight), and NC, the
// 16-column vectors of the output a pass over the values holds per row: what its registers hold.
#define RG 4  // rows sharing each key and value load

// The scores of rows q[0..3] against NV vectors of 16 keys (kt[v]: column c at + c * bs) into acc[r][v]: one
// FMA chain over c per (row, key), all side by side.
static inline __attribute__((always_inline)) void V(dots)(const int D, const float *const *q,
                                                          const float *const *kt, int64_t bs, VF acc[RG][NV]) {
    VF k[NV];
    for (int v = 0; v < NV; v++) k[v] = V(load)(kt[v]);
    for (int r = 0; r < RG; r++) {
        const VF qr = V(set1)(q[r][0]);
        for (int v = 0; v < NV; v++) acc[r][v] = V(mul)(qr, k[v]);
    }
    for (int c = 1; c < D; c++) {
        for (int v = 0; v < NV; v++) k[v] = V(load)(kt[v] + c * bs);
        for (int r = 0; r < RG; r++) {
            const VF qr = V(set1)(q[r][c]);
            for (int v = 0; v < NV; v++) acc[r][v] = V(fma)(qr, k[v], acc[r][v]);
        }
    }
}

// out[r] (n <= NC vectors of 16 from column c0) of rows w[0..3] over keys lo..hi: fma chains in position order.
static inline __attribute__((always_inline)) void V(values)(const int n, const float *const *w, float *const *out,
                                                            int c0, const Keys *s, int64_t lo, int64_t hi) {
    VF acc[RG][NC];
    for (int r = 0; r < RG; r++)
        for (int c = 0; c < n; c++) acc[r][c] = V(zero)();
    Cursor values = value_cursor(s, lo);
    for (int64_t j = lo; j <= hi; j++) {
        const float *row = next_value(&values) + c0;
        VF v[NC];
        for (int c = 0; c < n; c++) v[c] = V(load)(row + 16 * c);
        for (int r = 0; r < RG; r++) {
            const VF wr = V(set1)(w[r][j]);
            for (int c = 0; c < n; c++) acc[r][c] = V(fma)(wr, v[c], acc[r][c]);
        }
    }
    for (int r = 0; r < RG; r++)
        for (int c = 0; c < n; c++) V(store)(out[r] + c0 + 16 * c, acc[r][c]);
}

// Scores of one group of RG rows (in scores, as weights[r] - base) for the key vectors from base up to hi.
static inline __attribute__((always_inline)) void V(score_rows)(const int D, const float *const *q,
                                                                float *const *scores, const int64_t *his,
                                                                const Keys *s, int64_t base, int64_t lo, int64_t hi,
                                                                float scale, float softcap, VF top[RG]) {
    float buf[NV][s->bs % 16 ? 16 * D : 1];  // key vectors copied out of blocks smaller than 16
    for (int64_t p0 = base; p0 <= hi; p0 += 16 * NV) {
        const float *kt[NV];  // past hi: the first vector again, its scores not kept
        int64_t stride = s->bs;
        for (int v = 0; v < NV; v++) kt[v] = key_vector(s, p0 + 16 * v <= hi ? p0 + 16 * v : p0, hi, buf[v], &stride);
        VF acc[RG][NV];
        V(dots)(D, q, kt, stride, acc);
        for (int r = 0; r < RG; r++) {
            for (int v = 0; v < NV && p0 + 16 * v <= hi; v++) {
                VF x = V(mul)(acc[r][v], V(set1)(scale));
                if (softcap > 0) x = V(softcap)(x, softcap);
                x = V(outside)(x, lo - (p0 + 16 * v), his[r] - (p0 + 16 * v));
                V(store)(scores[r] + (p0 + 16 * v - base), x);
                top[r] = V(max)(top[r], x);
            }
        }
    }
}

static void V(attend)(const int D, int R, const float *const *q, float *const *out, const int64_t *his,
                      const Keys *s, int64_t lo, float scale, float softcap, float *scratch) {
    const int64_t base = lo & ~(int64_t)15;  // key vectors are 16 aligned positions of one block
    int64_t hi = lo;
    for (int r = 0; r < R; r++) hi = his[r] > hi ? his[r] : hi;
    const int64_t pitch = (hi - base) / 16 * 16 + 16;
    for (int g = 0; g < R; g += RG) {
        // a short last group repeats its last row: the same bits, computed and written twice
        const float *qs[RG];
        float *os[RG], *ws[RG];
        int64_t hs[RG], ghi = lo;
        for (int r = 0; r < RG; r++) {
            const int i = g + r < R ? g + r : R - 1;
            qs[r] = q[i], os[r] = out[i], hs[r] = his[i], ws[r] = scratch + r * pitch;
            ghi = his[i] > ghi ? his[i] : ghi;
        }
        VF top[RG];
        for (int r = 0; r < RG; r++) top[r] = V(set1)(-INFINITY);
        switch (D) {  // the common head sizes unrolled
            case 64: V(score_rows)(64, qs, ws, hs, s, base, lo, ghi, scale, softcap, top); break;
            case 128: V(score_rows)(128, qs, ws, hs, s, base, lo, ghi, scale, softcap, top); break;
            default: V(score_rows)(D, qs, ws, hs, s, base, lo, ghi, scale, softcap, top); break;
        }
        float total[RG];
        const float *w[RG];
        for (int r = 0; r < RG; r++) {  // the weights, in place of the scores, to the group's last key
            const VF t = V(set1)(V(hmax)(top[r]));
            VF sum = V(zero)();
            for (int64_t p0 = base; p0 <= ghi; p0 += 16) {
                float *e = ws[r] + (p0 - base);
                const VF x = V(exp)(V(sub)(V(load)(e), t));
                sum = V(add)(sum, x);
                V(store)(e, x);
            }
            total[r] = V(hsum)(sum);
            w[r] = ws[r] - base;  // indexed by position
        }
        for (int c0 = 0; c0 < D; c0 += 16 * NC) {
            switch ((D - c0) / 16 < NC ? (D - c0) / 16 : NC) {
#if NC == 4
                case 4: V(values)(4, w, os, c0, s, lo, ghi); break;
                case 3: V(values)(3, w, os, c0, s, lo, ghi); break;
                case 2: V(values)(2, w, os, c0, s, lo, ghi); break;
#endif
                default: V(values)(1, w, os, c0, s, lo, ghi); break;
            }
        }
        for (int r = 0; r < RG && g + r < R; r++) {  // each row once (a repeated one is not divided twice)
            const VF t = V(set1)(total[r]);
            for (int c = 0; c < D; c += 16) V(store)(os[r] + c, V(div)(V(load)(os[r] + c), t));
        }
    }
}
