// The repack alone (repack.h), a library of its own: it builds in a fraction of the kernel's time, so a model's
// first load repacks the GGUF while the kernel's GEMMs compile (gguf/load.py). qkernel.c exports the same two.
#include <stdlib.h>
#include "repack.h"

typedef void (*panel_fn)(const uint8_t *, int64_t, int64_t, int64_t, const int64_t *, int64_t, uint8_t *);

// A copy per block type of this build (-DQK_TYPES: a model's own), flattened: t is a constant there, so
// decode_block's and write_record's type branches fold away (a 1B Q4_K_M file's projections on two Zen 4 cores:
// 1.1-1.25 -> 0.28-0.34 s).
#define PANEL_OF(T)                                                                                                 \
    static __attribute__((flatten)) void panel_##T(const uint8_t *raw, int64_t row_bytes, int64_t N, int64_t K,     \
                                                   const int64_t *rows, int64_t p, uint8_t *out) {                  \
        repack_panel(T, raw, row_bytes, N, K, rows, p, out);                                                        \
    }
PANEL_OF(Q4_0) PANEL_OF(Q4_1) PANEL_OF(Q5_0) PANEL_OF(Q5_1) PANEL_OF(Q8_0)
PANEL_OF(Q2_K) PANEL_OF(Q3_K) PANEL_OF(Q4_K) PANEL_OF(Q5_K) PANEL_OF(Q6_K)

static const panel_fn PANELS[NTYPES] = {
    BUILT(Q4_0, panel_Q4_0), BUILT(Q4_1, panel_Q4_1), BUILT(Q5_0, panel_Q5_0), BUILT(Q5_1, panel_Q5_1),
    BUILT(Q8_0, panel_Q8_0), BUILT(Q2_K, panel_Q2_K), BUILT(Q3_K, panel_Q3_K), BUILT(Q4_K, panel_Q4_K),
    BUILT(Q5_K, panel_Q5_K), BUILT(Q6_K, panel_Q6_K)
};

int64_t packed_bytes(int t, int64_t n, int64_t k) { return packed_bytes_of(t, n, k); }

void repack(int t, const uint8_t *raw, int64_t row_bytes, int64_t N, int64_t K, const int64_t *rows, uint8_t *out,
            int threads) {
    const panel_fn panel = PANELS[t];
    if (!panel) {  // a type this build left out: the generic copy
        repack_rows(t, raw, row_bytes, N, K, rows, out, threads);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < (N + PANEL - 1) / PANEL; p++) panel(raw, row_bytes, N, K, rows, p, out);
}
