/* Fused element-wise steps of a Llama-family decoder layer for the embedded engine on CPU.
 *
 * Each kernel replaces a chain of small PyTorch ops (one dispatch and one pass over memory each) with one
 * pass, and reproduces Hugging Face's numerics: in bf16 every intermediate the PyTorch code rounds to
 * bf16 is rounded here at the same point, so outputs equal the transformers modules' bit for bit (up to
 * the order of the fp32 sum of squares).
 *
 *   hex_add_rmsnorm   residual += x (optional); out = w * bf16(residual * rsqrt(mean(residual^2) + eps))
 *   hex_rope_store    rotate q and k of every token by its position (q in place), write k and v into
 *                     the slot KV cache at (row, head, slot)
 *
 * Tensors are base pointers with element strides; the innermost dimension is contiguous.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t tobf(float f) { /* round to nearest even, as torch does (no NaN inputs here) */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float rbf(float f) { return bf(tobf(f)); } /* f rounded to bf16, as a float */

/* LlamaRMSNorm after the decoder layer's residual add: for each of n rows of h elements,
 *   if add: residual = residual + x (rounded to the dtype, written back)
 *   out = weight * dtype(residual * rsqrt(mean(residual^2) + eps))      (the sum of squares in fp32) */
int hex_add_rmsnorm(const void *x, void *residual, const void *weight, void *out, int64_t n, int64_t h,
                    float eps, int add, int bf16, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float ss = 0.f;
        if (bf16) {
            uint16_t *r = (uint16_t *)residual + i * h;
            const uint16_t *xi = (const uint16_t *)x + i * h, *w = (const uint16_t *)weight;
            uint16_t *o = (uint16_t *)out + i * h;
            if (add)
                for (int64_t j = 0; j < h; j++) r[j] = tobf(bf(r[j]) + bf(xi[j]));
            for (int64_t j = 0; j < h; j++) ss += bf(r[j]) * bf(r[j]);
            float inv = 1.f / sqrtf(ss / (float)h + eps);
            for (int64_t j = 0; j < h; j++) o[j] = tobf(bf(w[j]) * rbf(bf(r[j]) * inv));
        } else {
            float *r = (float *)residual + i * h, *o = (float *)out + i * h;
            const float *xi = (const float *)x + i * h, *w = (const float *)weight;
            if (add)
                for (int64_t j = 0; j < h; j++) r[j] += xi[j];
            for (int64_t j = 0; j < h; j++) ss += r[j] * r[j];
            float inv = 1.f / sqrtf(ss / (float)h + eps);
            for (int64_t j = 0; j < h; j++) o[j] = w[j] * (r[j] * inv);
        }
    }
    return 0;
}

/* One head of d elements rotated as transformers' apply_rotary_pos_emb does it:
 *   out = x * cos + rotate_half(x) * sin,  rotate_half(x) = (-x[d/2:], x[:d/2])
 * in bf16 each product and the sum rounded, as the PyTorch expression rounds them. */
static inline void rotate_bf16(const uint16_t *x, const uint16_t *c, const uint16_t *s, uint16_t *dst, int d) {
    int half = d / 2;
    for (int j = 0; j < half; j++) {
        float x1 = bf(x[j]), x2 = bf(x[j + half]);
        float lo = rbf(x1 * bf(c[j])) + rbf(-x2 * bf(s[j]));
        float hi = rbf(x2 * bf(c[j + half])) + rbf(x1 * bf(s[j + half]));
        dst[j] = tobf(lo);
        dst[j + half] = tobf(hi);
    }
}

static inline void rotate_f32(const float *x, const float *c, const float *s, float *dst, int d) {
    int half = d / 2;
    for (int j = 0; j < half; j++) {
        float x1 = x[j], x2 = x[j + half];
        dst[j] = x1 * c[j] + -x2 * s[j];
        dst[j + half] = x2 * c[j + half] + x1 * s[j + half];
    }
}

static inline void rotate(int bf16, const void *x, const void *c, const void *s, void *dst, int d) {
    if (bf16) rotate_bf16((const uint16_t *)x, (const uint16_t *)c, (const uint16_t *)s, (uint16_t *)dst, d);
    else rotate_f32((const float *)x, (const float *)c, (const float *)s, (float *)dst, d);
}

/* For each of n tokens, whose projections q|k|v lie side by side at qkv + i * tok_stride (hq, hk and hk
 * heads of d elements): rotate the q heads in place and write the rotated k heads and the v heads into
 * k_buf/v_buf at [rows[i], head, slots[i], :] (strides in elements). cos/sin are [n, d]. */
int hex_rope_store(void *qkv, int64_t tok_stride, const void *cos, const void *sin, void *k_buf, void *v_buf,
                   int64_t kv_row_stride, int64_t kv_head_stride, int64_t kv_slot_stride, const int64_t *rows,
                   const int64_t *slots, int64_t n, int hq, int hk, int d, int bf16, int threads) {
    if (d % 2) return 1;
    const size_t es = bf16 ? sizeof(uint16_t) : sizeof(float), head = es * (size_t)d; /* bytes */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        char *t = (char *)qkv + i * tok_stride * es;
        const char *c = (const char *)cos + i * head, *s = (const char *)sin + i * head;
        char *k = (char *)k_buf + (rows[i] * kv_row_stride + slots[i] * kv_slot_stride) * es;
        char *v = (char *)v_buf + (rows[i] * kv_row_stride + slots[i] * kv_slot_stride) * es;
        float tmp[d]; /* room for d elements of either dtype, aligned for floats */
        for (int h = 0; h < hq; h++) {
            rotate(bf16, t + h * head, c, s, tmp, d);
            memcpy(t + h * head, tmp, head);
        }
        for (int h = 0; h < hk; h++) {
            rotate(bf16, t + (hq + h) * head, c, s, k + h * kv_head_stride * es, d);
            memcpy(v + h * kv_head_stride * es, t + (hq + hk + h) * head, head);
        }
    }
    return 0;
}
