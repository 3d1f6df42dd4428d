// The GGUF block types the kernel reads, and the packed layout it reads them in.
//
// Every type is w = s * (u - z) + o per group of G weights along K: u an unsigned code of `bits` bits, z the
// type's zero point, s and o from the block's scales (K-quants: a super-block of 256 with an integer scale and
// min per group). The kernel multiplies u by int8 activations (exact int32 sums per group), applies z and the
// integer group scales in int32, and the float scales once per block (32-types) or super-block (K-quants).
//
// Packed layout (repack.h writes it): output channels in panels of 16, each panel a run of records, one per
// super-block along K. A record holds, in order:
//   d[16] fp16 | dm[16] fp16 (types with a min) | the group scales and mins (K-quants, see kq_value) | codes of
//   each group
// so a record takes exactly the bytes of its 16 rows' GGUF blocks (the cache file is no larger than the file)
// and a group's codes are its G/4 "VNNI vectors": vector j, byte 4n + t = u[4j + t][channel n], stored as
//   8 bits (Q8_0, as signed q = u ^ 0x80), nibbles (4-6 bits: vector j low, vector j + G/8 high),
//   or 2-bit crumbs (2-3 bits: crumb c of each byte is vector c), then one 64-bit mask per vector and high bit.
#pragma once
#include <stdint.h>
#include <string.h>
#include <emmintrin.h>

#define PANEL 16
#define QK 256

enum { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, NTYPES };

// The block types this build has GEMMs for (-DQK_TYPES=a bit mask of the enum; all by default): a model's load
// builds its own types only (a Q4_K_M file: Q4_K and Q6_K), as the other types' code is never emitted when their
// table entries are NULL. gemm() runs a missing type on the scalar reference (the same bits, slowly).
#ifndef QK_TYPES
#define QK_TYPES ((1 << NTYPES) - 1)
#endif
#define BUILT(T, fn) ((QK_TYPES >> (T)) & 1 ? fn : NULL)
// and the vector paths this build has (-DQK_PATHS=a mask of 1 AVX2, 2 AVX-512 VNNI, 4 AMX, 8 VNNI_MUL; all by
// default): a model's load builds the paths its CPU runs only (a VNNI CPU: VNNI alone), as gcc's time is most of a
// first run
#ifndef QK_PATHS
#define QK_PATHS 15
#endif
#define BUILT_ON(P, T, fn) ((QK_PATHS >> ((P) - 1)) & 1 ? BUILT(T, fn) : NULL)

typedef struct {
    int sb;          // weights per super-block (block, for 32-types) along K
    int g;           // weights per group (one integer scale)
    int bits;        // code bits
    int z;           // zero point: w = s * (u - z) (+ min)
    int kquant;      // 1: integer group scales in a 256 super-block, activations in Q8_K
    int mins;        // 1: a float min (32-types: m; K-quants: dmin * mn)
    int block_bytes; // GGUF bytes per super-block of one row
    int sbits;       // K-quants: bits of a group scale (and min), as the file stores them
    int sbias;       // K-quants: stored scale = scale + sbias (Q3_K's 6-bit signed scales)
} qtype_t;

static const qtype_t QT[NTYPES] = {
    [Q4_0] = {32, 32, 4, 8, 0, 0, 18},   [Q4_1] = {32, 32, 4, 0, 0, 1, 20},
    [Q5_0] = {32, 32, 5, 16, 0, 0, 22},  [Q5_1] = {32, 32, 5, 0, 0, 1, 24},
    [Q8_0] = {32, 32, 8, 128, 0, 0, 34}, [Q2_K] = {QK, 16, 2, 0, 1, 1, 84, 4, 0},
    [Q3_K] = {QK, 16, 3, 4, 1, 0, 110, 6, 32},  [Q4_K] = {QK, 32, 4, 0, 1, 1, 144, 6, 0},
    [Q5_K] = {QK, 32, 5, 0, 1, 1, 176, 6, 0},  [Q6_K] = {QK, 16, 6, 32, 1, 0, 210, 8, 0},
};

typedef struct {
    int groups;      // groups per record
    int vecs;        // VNNI vectors per group (G / 4)
    int base_bytes;  // a group's low bits (8-bit bytes, nibbles or crumbs)
    int high_bits;   // bits above the base, each a 64-bit mask per vector
    int group_bytes; // base + masks
    int off_dm, off_sc, off_codes, record_bytes;
} layout_t;

static inline __attribute__((always_inline)) layout_t layout_of(const int t) {
    const qtype_t q = QT[t];
    layout_t L;
    L.groups = q.sb / q.g;
    L.vecs = q.g / 4;
    const int base = q.bits == 8 ? 8 : q.bits >= 4 ? 4 : 2;
    L.high_bits = q.bits == 8 ? 0 : q.bits - base;
    L.base_bytes = L.vecs * 64 * base / 8;
    L.group_bytes = L.base_bytes + L.high_bits * L.vecs * 8;
    L.off_dm = 32;
    L.off_sc = L.off_dm + (q.mins ? 32 : 0);
    L.off_codes = L.off_sc + (q.kquant ? (q.sbits == 6 ? 12 : 16) * PANEL : 0);
    L.record_bytes = L.off_codes + L.groups * L.group_bytes;
    return L;
}

// K-quants' scales and mins, as packed as the file packs them: values x_0..x_{n-1} (scales, then mins: value
// `groups + g` is group g's min), each held for the 16 channels in 16-byte planes (byte n: channel n) as
//   8 bits (Q6_K):       plane i
//   4 bits (Q2_K):       plane i % 16, nibble i / 16
//   6 bits (Q3_K-Q5_K):  low 4 bits in plane i % 8, nibble i / 8; high 2 bits in plane 8 + i % 4, bits 2 * (i / 8) +
//                        4 * (i % 8 / 4)
static inline int kq_value(const int t, const uint8_t *rec, int i, int n) {
    const uint8_t *p = rec + layout_of(t).off_sc + n;
    switch (QT[t].sbits) {
    case 8: return p[16 * i];
    case 4: return (p[16 * (i % 16)] >> (4 * (i / 16))) & 15;
    default: return ((p[16 * (i % 8)] >> (4 * (i / 8))) & 15) | (((p[16 * (8 + i % 4)] >> (2 * (i / 8) + 4 * (i % 8 / 4))) & 3) << 4);
    }
}

static inline void kq_put(const int t, uint8_t *rec, int i, int n, int x) {
    uint8_t *p = rec + layout_of(t).off_sc + n;
    switch (QT[t].sbits) {
    case 8: p[16 * i] = (uint8_t)x; break;
    case 4: p[16 * (i % 16)] |= (uint8_t)((x & 15) << (4 * (i / 16))); break;
    default:
        p[16 * (i % 8)] |= (uint8_t)((x & 15) << (4 * (i / 8)));
        p[16 * (8 + i % 4)] |= (uint8_t)(((x >> 4) & 3) << (2 * (i / 8) + 4 * (i % 8 / 4)));
    }
}

// Value i of the 16 channels as 16 bytes (SSE2: every x86-64 path).
static inline __attribute__((always_inline)) __m128i kq_values16(const int t, const uint8_t *rec, int i) {
    const uint8_t *p = rec + layout_of(t).off_sc;
    const int sbits = QT[t].sbits, planes = sbits == 4 ? 16 : 8;
    if (sbits == 8) return _mm_loadu_si128((const __m128i *)(p + 16 * i));
    const __m128i lo = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * (i % planes))),
                                                   _mm_cvtsi32_si128(4 * (i / planes))), _mm_set1_epi8(15));
    if (sbits == 4) return lo;
    const __m128i hi = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(p + 16 * (8 + i % 4))),
                                                   _mm_cvtsi32_si128(2 * (i / 8) + 4 * (i % 8 / 4))), _mm_set1_epi8(3));
    return _mm_or_si128(lo, _mm_slli_epi16(hi, 4));
}

// Group g's scales (signed bytes) and mins (unsigned) of the 16 channels.
static inline __attribute__((always_inline)) __m128i kq_scales16(const int t, const uint8_t *rec, int g) {
    const __m128i v = kq_values16(t, rec, g);
    return QT[t].sbias ? _mm_sub_epi8(v, _mm_set1_epi8((char)QT[t].sbias)) : v;
}

static inline __attribute__((always_inline)) __m128i kq_mins16(const int t, const uint8_t *rec, int g) {
    return kq_values16(t, rec, layout_of(t).groups + g);
}

// Group g's c of the 16 channels, what multiplies its sum of q (gemm_ref.h's osb): the min, else the scale (the
// zero point's share); unsigned with a min, signed without.
static inline __attribute__((always_inline)) __m128i kq_offsets16(const int t, const uint8_t *rec, int g) {
    return QT[t].mins ? kq_mins16(t, rec, g) : kq_scales16(t, rec, g);
}

static inline float fp16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalize
            int e = -1;
            do { e++; mant <<= 1; } while (!(mant & 0x400));
            bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3FF) << 13);
        }
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// Round to nearest even, as F16C's _cvtss_sh and numpy's float16 cast.
static inline uint16_t f32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000;
    const uint32_t ax = x & 0x7FFFFFFF;
    if (ax >= 0x7F800000) return (uint16_t)(sign | 0x7C00 | (ax > 0x7F800000 ? 0x200 : 0));
    if (ax >= 0x477FF000) return (uint16_t)(sign | 0x7C00);  // rounds past the largest half
    if (ax < 0x38800000) {  // subnormal half (or zero)
        const uint32_t shift = 126 - (ax >> 23);
        if (shift > 24) return (uint16_t)sign;
        const uint32_t mant = (ax & 0x7FFFFF) | 0x800000;
        uint32_t h = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((ax >> 13) - (112 << 10));
    const uint32_t rem = ax & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

// One GGUF super-block of one row, decoded: codes u[sb], group scales and mins, the fp16 d and dm.
typedef struct {
    uint8_t u[QK];
    int8_t sc[16];   // K-quants' group scales (signed for Q3_K and Q6_K)
    uint8_t mn[16];  // K-quants' group mins
    uint16_t d, dm;  // fp16 bits: d, and the min (Q4_1/Q5_1: m; K-quants: dmin)
} block_t;

static void decode_block(const int t, const uint8_t *b, block_t *o) {
    uint16_t d16, m16;
    memcpy(&d16, b, 2);
    o->d = d16;
    o->dm = 0;
    switch (t) {
    case Q4_0: case Q4_1: {
        const uint8_t *qs = b + (t == Q4_1 ? 4 : 2);
        if (t == Q4_1) { memcpy(&m16, b + 2, 2); o->dm = m16; }
        for (int i = 0; i < 16; i++) { o->u[i] = qs[i] & 0x0F; o->u[i + 16] = qs[i] >> 4; }
        break;
    }
    case Q5_0: case Q5_1: {
        const int off = t == Q5_1 ? 4 : 2;
        uint32_t qh;
        if (t == Q5_1) { memcpy(&m16, b + 2, 2); o->dm = m16; }
        memcpy(&qh, b + off, 4);
        const uint8_t *qs = b + off + 4;
        for (int i = 0; i < 16; i++) {
            o->u[i] = (uint8_t)((qs[i] & 0x0F) | (((qh >> i) & 1) << 4));
            o->u[i + 16] = (uint8_t)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
        }
        break;
    }
    case Q8_0:
        for (int i = 0; i < 32; i++) o->u[i] = (uint8_t)((int8_t)b[2 + i] + 128);
        break;
    case Q2_K: {
        const uint8_t *scales = b, *qs = b + 16;
        memcpy(&d16, b + 80, 2); memcpy(&m16, b + 82, 2);
        o->d = d16; o->dm = m16;
        for (int g = 0; g < 16; g++) { o->sc[g] = (int8_t)(scales[g] & 0x0F); o->mn[g] = scales[g] >> 4; }
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int i = 0; i < 32; i++) o->u[128 * h + 32 * s + i] = (qs[32 * h + i] >> (2 * s)) & 3;
        break;
    }
    case Q3_K: {
        const uint8_t *hmask = b, *qs = b + 32, *scales = b + 96;
        memcpy(&d16, b + 108, 2);
        o->d = d16;
        for (int i = 0; i < 16; i++) {
            const int lo = (scales[i % 8] >> (4 * (i / 8))) & 0x0F;
            const int hi = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
            o->sc[i] = (int8_t)((lo | (hi << 4)) - 32);
        }
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int i = 0; i < 32; i++) {
                    const int e = 128 * h + 32 * s + i;
                    o->u[e] = (uint8_t)(((qs[32 * h + i] >> (2 * s)) & 3) | (((hmask[i] >> (e / 32)) & 1) << 2));
                }
        break;
    }
    case Q4_K: case Q5_K: {
        memcpy(&m16, b + 2, 2);
        o->dm = m16;
        const uint8_t *s = b + 4;
        for (int j = 0; j < 4; j++) {
            o->sc[j] = (int8_t)(s[j] & 63);
            o->mn[j] = s[4 + j] & 63;
            o->sc[4 + j] = (int8_t)((s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30));
            o->mn[4 + j] = (uint8_t)((s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30));
        }
        const uint8_t *qh = b + 16, *qs = b + (t == Q5_K ? 48 : 16);
        for (int c = 0; c < 4; c++)
            for (int i = 0; i < 32; i++) {
                o->u[64 * c + i] = qs[32 * c + i] & 0x0F;
                o->u[64 * c + 32 + i] = qs[32 * c + i] >> 4;
            }
        if (t == Q5_K)
            for (int e = 0; e < QK; e++) o->u[e] |= (uint8_t)(((qh[e % 32] >> (e / 32)) & 1) << 4);
        break;
    }
    case Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        memcpy(&d16, b + 208, 2);
        o->d = d16;
        for (int g = 0; g < 16; g++) o->sc[g] = scales[g];
        for (int h = 0; h < 2; h++)
            for (int a = 0; a < 2; a++)
                for (int i = 0; i < 64; i++) o->u[128 * h + 64 * a + i] = (ql[64 * h + i] >> (4 * a)) & 0x0F;
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < 4; s++)
                for (int i = 0; i < 32; i++) o->u[128 * h + 32 * s + i] |= (uint8_t)(((qh[32 * h + i] >> (2 * s)) & 3) << 4);
        break;
    }
    }
}

// The block's weights as gguf's numpy dequantize computes them (the same float32 operations, in order).
static void block_weights(const int t, const block_t *o, float *w) {
    const qtype_t q = QT[t];
    const float d = fp16_to_f32(o->d), dm = fp16_to_f32(o->dm);
    for (int e = 0; e < q.sb; e++) {
        const int g = e / q.g;
        const float u = (float)o->u[e];
        switch (t) {
        case Q4_0: case Q5_0: w[e] = d * (float)((int)o->u[e] - q.z); break;
        case Q4_1: case Q5_1: w[e] = d * u + dm; break;
        case Q8_0: w[e] = (float)((int)o->u[e] - 128) * d; break;
        case Q2_K: case Q4_K: case Q5_K: {
            const float dl = d * (float)o->sc[g], ml = dm * (float)o->mn[g];
            w[e] = dl * u - ml;
            break;
        }
        case Q3_K: case Q6_K: w[e] = (d * (float)o->sc[g]) * (float)((int)o->u[e] - q.z); break;
        }
    }
}
