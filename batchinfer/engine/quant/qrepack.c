// The repack alone (repack.h), a library of its own: it builds in a fraction of the kernel's time, so a model's
// first load repacks the GGUF while the kernel's GEMMs compile (gguf/load.py). qkernel.c exports the same two.
#include <stdlib.h>
#include "repack.h"

int64_t packed_bytes(int t, int64_t n, int64_t k) { return packed_bytes_of(t, n, k); }

void repack(int t, const uint8_t *raw, int64_t row_bytes, int64_t N, int64_t K, const int64_t *rows, uint8_t *out,
            int threads) {
    repack_rows(t, raw, row_bytes, N, K, rows, out, threads);
}
