/* Decode attention over the embedded engine's slot KV cache: one query token per row, grouped heads.
 *
 * For row b and KV head h, the G query heads h*G .. h*G+G-1 attend slots [0, lens[b]) of that row:
 *
 *     out[b, h*G+g] = sum_p softmax_p(scale * q[b, h*G+g] . k[b, h, p]) * v[b, h, p]
 *
 * Each (row, KV head) task reads its keys once for all G query heads (pass 1: scores), then its
 * values once (pass 2), converting bf16 to fp32 on the fly and accumulating in fp32; tasks are spread
 * over OpenMP threads. PyTorch's CPU SDPA handles this shape (a handful of queries against a long
 * strided KV view) with per-block GEMM calls whose overhead dominates; here the inner loops are plain
 * vectorisable arithmetic and the cost is close to streaming the KV rows once.
 *
 * Tensors are given as base pointers and element strides; the head dimension is contiguous.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_D 256
#define MAX_G 16

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline void load_row(const void *base, int64_t off, int bf16, int D, float *dst) {
    if (bf16) {
        const uint16_t *p = (const uint16_t *)base + off;
        for (int d = 0; d < D; d++) dst[d] = bf16_to_f32(p[d]);
    } else {
        const float *p = (const float *)base + off;
        for (int d = 0; d < D; d++) dst[d] = p[d];
    }
}


#if defined(__AVX512BF16__) && defined(__AVX512DQ__) && defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_BF16_DOT 1

static inline __m128 sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) { /* the 4 horizontal sums */
    __m256 t0 = _mm256_add_ps(_mm512_castps512_ps256(a0), _mm512_extractf32x8_ps(a0, 1));
    __m256 t1 = _mm256_add_ps(_mm512_castps512_ps256(a1), _mm512_extractf32x8_ps(a1, 1));
    __m256 t2 = _mm256_add_ps(_mm512_castps512_ps256(a2), _mm512_extractf32x8_ps(a2, 1));
    __m256 t3 = _mm256_add_ps(_mm512_castps512_ps256(a3), _mm512_extractf32x8_ps(a3, 1));
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(t0, t1), _mm256_hadd_ps(t2, t3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Pass 1 for bf16 rows with D a multiple of 32: scores[g][p] = scale * q_g . k_p, four keys at a time,
 * each dot product a chain of AVX512-BF16 pair dot products (vdpbf16ps) accumulating in fp32. */
static void scores_bf16(const uint16_t *qrows[], const uint16_t *k, int64_t k_sp, int64_t L, int G, int D,
                        float scale, float *scores, int64_t stride) {
    __m512bh qv[MAX_G][MAX_D / 32];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < D / 32; c++) qv[g][c] = (__m512bh)_mm512_loadu_si512(qrows[g] + 32 * c);
    int64_t p = 0;
    for (; p + 4 <= L; p += 4) {
        for (int g = 0; g < G; g++) {
            __m512 a[4];
            for (int j = 0; j < 4; j++) {
                const uint16_t *kp = k + (p + j) * k_sp;
                __m512 acc = _mm512_setzero_ps();
                for (int c = 0; c < D / 32; c++)
                    acc = _mm512_dpbf16_ps(acc, qv[g][c], (__m512bh)_mm512_loadu_si512(kp + 32 * c));
                a[j] = acc;
            }
            _mm_storeu_ps(scores + g * stride + p, _mm_mul_ps(sum4(a[0], a[1], a[2], a[3]), _mm_set1_ps(scale)));
        }
    }
    for (; p < L; p++) {
        const uint16_t *kp = k + p * k_sp;
        for (int g = 0; g < G; g++) {
            __m512 acc = _mm512_setzero_ps();
            for (int c = 0; c < D / 32; c++)
                acc = _mm512_dpbf16_ps(acc, qv[g][c], (__m512bh)_mm512_loadu_si512(kp + 32 * c));
            scores[g * stride + p] = scale * _mm512_reduce_add_ps(acc);
        }
    }
}

/* Pass 2 for bf16 rows with D a multiple of 64: out_g = sum_p w[g][p] * v_p. Each value row is
 * converted to fp32 once for a block of up to 4 query heads (their 64-wide accumulator slices stay in 16
 * registers), so the conversion is not repeated per head. */
static inline __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __attribute__((always_inline)) void values_block(const uint16_t *v, int64_t v_sp, int64_t L,
                                                                const float *w, int64_t stride, float acc[][MAX_D],
                                                                int c, const int gn) {
    __m512 a[4][4];
    for (int g = 0; g < gn; g++)
        for (int j = 0; j < 4; j++) a[g][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < L; p++) {
        const uint16_t *vp = v + p * v_sp + c;
        __m512 x0 = bf16x16(vp), x1 = bf16x16(vp + 16), x2 = bf16x16(vp + 32), x3 = bf16x16(vp + 48);
        for (int g = 0; g < gn; g++) {
            __m512 wp = _mm512_set1_ps(w[g * stride + p]);
            a[g][0] = _mm512_fmadd_ps(wp, x0, a[g][0]);
            a[g][1] = _mm512_fmadd_ps(wp, x1, a[g][1]);
            a[g][2] = _mm512_fmadd_ps(wp, x2, a[g][2]);
            a[g][3] = _mm512_fmadd_ps(wp, x3, a[g][3]);
        }
    }
    for (int g = 0; g < gn; g++)
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(acc[g] + c + 16 * j, a[g][j]);
}

static void values_bf16(const uint16_t *v, int64_t v_sp, int64_t L, int G, int D, const float *scores,
                        int64_t stride, float acc[][MAX_D]) {
    for (int c = 0; c < D; c += 64)
        for (int g0 = 0; g0 < G; g0 += 4) {
            const float *w = scores + g0 * stride;
            switch (G - g0 < 4 ? G - g0 : 4) { /* constant block sizes, so the accumulators stay in registers */
            case 1: values_block(v, v_sp, L, w, stride, acc + g0, c, 1); break;
            case 2: values_block(v, v_sp, L, w, stride, acc + g0, c, 2); break;
            case 3: values_block(v, v_sp, L, w, stride, acc + g0, c, 3); break;
            default: values_block(v, v_sp, L, w, stride, acc + g0, c, 4); break;
            }
        }
}
#endif

int hex_decode_attention(const void *q, int64_t q_sb, int64_t q_sh,
                         const void *k, int64_t k_sb, int64_t k_sh, int64_t k_sp,
                         const void *v, int64_t v_sb, int64_t v_sh, int64_t v_sp,
                         const int64_t *lens, int64_t max_len, void *out,
                         int B, int KVH, int G, int D, float scale, int bf16, int threads) {
    if (D > MAX_D || G > MAX_G || max_len < 1) return 1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = (float *)malloc(sizeof(float) * (size_t)G * (size_t)max_len);
        if (!scores) {
#pragma omp atomic write
            failed = 2;
        }
#pragma omp for schedule(dynamic, 4)
        for (int task = 0; task < B * KVH; task++) {
            if (!scores) continue;
            int b = task / KVH, h = task % KVH;
            int64_t L = lens[b];
            float qf[MAX_G][MAX_D], acc[MAX_G][MAX_D], row[MAX_D];
            for (int g = 0; g < G; g++) {
                load_row(q, b * q_sb + (int64_t)(h * G + g) * q_sh, bf16, D, qf[g]);
                for (int d = 0; d < D; d++) {
                    qf[g][d] *= scale;
                    acc[g][d] = 0.f;
                }
            }
#ifdef HAVE_BF16_DOT
            if (bf16 && D % 32 == 0) { /* pass 1, fast path (q unscaled: dot products of the bf16 values) */
                const uint16_t *qrows[MAX_G];
                for (int g = 0; g < G; g++) qrows[g] = (const uint16_t *)q + b * q_sb + (int64_t)(h * G + g) * q_sh;
                scores_bf16(qrows, (const uint16_t *)k + b * k_sb + h * k_sh, k_sp, L, G, D, scale, scores, max_len);
            } else
#endif
            for (int64_t p = 0; p < L; p++) { /* pass 1: every query head's score against key p */
                load_row(k, b * k_sb + h * k_sh + p * k_sp, bf16, D, row);
                for (int g = 0; g < G; g++) {
                    float s = 0.f;
                    for (int d = 0; d < D; d++) s += qf[g][d] * row[d];
                    scores[g * max_len + p] = s;
                }
            }
            for (int g = 0; g < G; g++) { /* softmax over the row's slots */
                float *s = scores + g * max_len, m = -FLT_MAX, sum = 0.f;
                for (int64_t p = 0; p < L; p++) m = s[p] > m ? s[p] : m;
                for (int64_t p = 0; p < L; p++) {
                    s[p] = expf(s[p] - m);
                    sum += s[p];
                }
                float inv = L > 0 ? 1.f / sum : 0.f;
                for (int64_t p = 0; p < L; p++) s[p] *= inv;
            }
#ifdef HAVE_BF16_DOT
            if (bf16 && D % 64 == 0)
                values_bf16((const uint16_t *)v + b * v_sb + h * v_sh, v_sp, L, G, D, scores, max_len, acc);
            else
#endif
            for (int64_t p = 0; p < L; p++) { /* pass 2: the weighted sum of values */
                load_row(v, b * v_sb + h * v_sh + p * v_sp, bf16, D, row);
                for (int g = 0; g < G; g++) {
                    float w = scores[g * max_len + p];
                    for (int d = 0; d < D; d++) acc[g][d] += w * row[d];
                }
            }
            for (int g = 0; g < G; g++) {
                int64_t o = ((int64_t)b * KVH * G + h * G + g) * D;
                for (int d = 0; d < D; d++) {
                    if (bf16) ((uint16_t *)out)[o + d] = f32_to_bf16(acc[g][d]);
                    else ((float *)out)[o + d] = acc[g][d];
                }
            }
        }
        free(scores);
    }
    return failed;
}
