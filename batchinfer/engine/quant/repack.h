// GGUF rows -> the packed panel layout (qtypes.h), and both back to float32 (embedding rows, tests).
#pragma once
#include "qtypes.h"

static int64_t packed_bytes_of(int t, int64_t n, int64_t k) {
    return (n + PANEL - 1) / PANEL * (k / QT[t].sb) * layout_of(t).record_bytes;
}

// One record: 16 channels' decoded blocks (a channel past N is all zero) -> rec.
static void write_record(const int t, const block_t *blk, uint8_t *rec) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    memset(rec, 0, (size_t)L.record_bytes);
    uint16_t *d = (uint16_t *)rec, *dm = (uint16_t *)(rec + L.off_dm);
    for (int n = 0; n < PANEL; n++) {
        d[n] = blk[n].d;
        if (q.mins) dm[n] = blk[n].dm;
        for (int g = 0; q.kquant && g < L.groups; g++) {
            kq_put(t, rec, g, n, blk[n].sc[g] + q.sbias);
            if (q.mins) kq_put(t, rec, L.groups + g, n, blk[n].mn[g]);
        }
    }
    // Four codes of a channel at a time (a 32-bit word: byte i is code 4j + i), so a vector's byte 4n + i is
    // written as one word and a high bit's 4 mask bits are gathered by one multiply.
    const int half = L.vecs / 2, base = q.bits == 8 ? 8 : q.bits >= 4 ? 4 : 2;
    for (int g = 0; g < L.groups; g++) {
        uint8_t *codes = rec + L.off_codes + g * L.group_bytes;
        uint64_t *masks = (uint64_t *)(codes + L.base_bytes);
        for (int j = 0; j < L.vecs; j++)
            for (int n = 0; n < PANEL; n++) {
                uint32_t w, was;
                memcpy(&w, blk[n].u + g * q.g + 4 * j, 4);
                if (q.bits == 8) {
                    w ^= 0x80808080u;
                    memcpy(codes + 64 * j + 4 * n, &w, 4);
                } else {  // nibbles: vector j low, j + half high; crumbs: crumb j of each byte
                    uint8_t *to = codes + (q.bits >= 4 ? 64 * (j % half) : 0) + 4 * n;
                    memcpy(&was, to, 4);
                    was |= q.bits >= 4 ? (w & 0x0F0F0F0Fu) << (j < half ? 0 : 4) : (w & 0x03030303u) << (2 * j);
                    memcpy(to, &was, 4);
                }
                for (int h = 0; h < L.high_bits; h++) {  // bit (base + h) of the 4 bytes -> mask bits 4n..4n+3
                    const uint32_t bits = (w >> (base + h)) & 0x01010101u;
                    masks[h * L.vecs + j] |= (uint64_t)(((bits * 0x01020408u) >> 24) & 0xF) << (4 * n);
                }
            }
    }
}

// Panel p's records from its 16 rows of raw (N rows of K / sb GGUF blocks, row_bytes apart); output channel n is
// raw row rows[n] (rows NULL: row n), which undoes a file's row order (llama.cpp's RoPE permutation of q and k).
static inline void repack_panel(const int t, const uint8_t *raw, int64_t row_bytes, int64_t N, int64_t K,
                                const int64_t *rows, int64_t p, uint8_t *out) {
    const int64_t nsb = K / QT[t].sb;
    block_t blk[PANEL];
    for (int64_t s = 0; s < nsb; s++) {
        for (int n = 0; n < PANEL; n++) {
            const int64_t row = p * PANEL + n;
            if (row < N) decode_block(t, raw + (rows ? rows[row] : row) * row_bytes + s * QT[t].block_bytes, &blk[n]);
            else memset(&blk[n], 0, sizeof blk[n]);
        }
        write_record(t, blk, out + (p * nsb + s) * layout_of(t).record_bytes);
    }
}

// raw -> out (packed_bytes_of(t, N, K)), every type in one copy (qrepack.c has a copy per type, for a first load).
static void repack_rows(int t, const uint8_t *raw, int64_t row_bytes, int64_t N, int64_t K, const int64_t *rows, uint8_t *out,
            int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t p = 0; p < (N + PANEL - 1) / PANEL; p++) repack_panel(t, raw, row_bytes, N, K, rows, p, out);
}

// Rows `ids` of a GGUF tensor as float32 [n_ids, K], as gguf's numpy dequantize gives them.
static void dequant_gguf_rows(int t, const uint8_t *raw, int64_t row_bytes, int64_t K, const int64_t *ids, int64_t n_ids,
                  float *out, int threads) {
    const int sb = QT[t].sb;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < n_ids; r++) {
        block_t blk;
        for (int64_t s = 0; s < K / sb; s++) {
            decode_block(t, raw + ids[r] * row_bytes + s * QT[t].block_bytes, &blk);
            block_weights(t, &blk, out + r * K + s * sb);
        }
    }
}

// Channel n of a record, decoded back to its block (the inverse of write_record).
static void unpack_column(const int t, const uint8_t *rec, int n, block_t *blk) {
    const qtype_t q = QT[t];
    const layout_t L = layout_of(t);
    memcpy(&blk->d, rec + 2 * n, 2);
    blk->dm = 0;
    if (q.mins) memcpy(&blk->dm, rec + L.off_dm + 2 * n, 2);
    for (int g = 0; q.kquant && g < L.groups && g < 16; g++) {
        blk->sc[g] = (int8_t)(kq_value(t, rec, g, n) - q.sbias);
        blk->mn[g] = q.mins ? (uint8_t)kq_value(t, rec, L.groups + g, n) : 0;
    }
    for (int g = 0; g < L.groups; g++) {
        const uint8_t *codes = rec + L.off_codes + g * L.group_bytes;
        const uint64_t *masks = (const uint64_t *)(codes + L.base_bytes);
        for (int j = 0; j < L.vecs; j++)
            for (int i = 0; i < 4; i++) {
                const int byte = 4 * n + i, half = L.vecs / 2;
                uint8_t u;
                if (q.bits == 8) u = codes[64 * j + byte] ^ 0x80;
                else if (q.bits >= 4) u = (codes[64 * (j % half) + byte] >> (j < half ? 0 : 4)) & 0x0F;
                else u = (codes[byte] >> (2 * j)) & 3;
                for (int h = 0; h < L.high_bits; h++)
                    if ((masks[h * L.vecs + j] >> byte) & 1) u |= (uint8_t)(1 << ((q.bits >= 4 ? 4 : 2) + h));
                blk->u[g * q.g + 4 * j + i] = u;
            }
    }
}

// The packed weights back to float32 [N, K] (tests: the layout loses nothing).
static void dequant_panels(int t, const uint8_t *w, int64_t N, int64_t K, float *out) {
    const int64_t nsb = K / QT[t].sb;
    const int rec = layout_of(t).record_bytes;
    for (int64_t p = 0; p < (N + PANEL - 1) / PANEL; p++)
        for (int64_t s = 0; s < nsb; s++)
            for (int n = 0; n < PANEL && p * PANEL + n < N; n++) {
                block_t blk;
                unpack_column(t, w + (p * nsb + s) * rec, n, &blk);
                block_weights(t, &blk, out + (p * PANEL + n) * K + s * QT[t].sb);
            }
}
