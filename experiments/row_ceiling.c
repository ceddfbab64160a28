/* The row kernel's block written in C with AVX-512 intrinsics, for
 * experiments/row_ceiling.py: a 5x5 stride-1 depthwise convolution of
 * 14 x 14 planes (padding 2), a block of 7 output rows of one 16-lane
 * vector each (14 columns), as cso's row plan computes it: each input row
 * loaded once per column tap (unaligned, whole), its taps added under a
 * mask register of the lanes whose column stays on the plane, rows off
 * the plane skipped (as cso's kernel skips them), each row of the block stored under
 * a mask of its 14 columns.
 *
 * Two builds of the same loop: run_fixed, whose geometry (width, height,
 * block starts) is known at compile time, and run_runtime, which takes it
 * as arguments (as cso's nest does).  Built as a shared library by
 * row_ceiling.py with gcc -O3 -march=native.
 */
#include <immintrin.h>
#include <stdint.h>

#define TAPS 5
#define BLOCK 7
#define WINDOW (BLOCK + TAPS - 1)

static inline __attribute__((always_inline)) void column_masks(__mmask16 *masks, int width) {
    _Pragma("GCC unroll 16") for (int s = 0; s < TAPS; s++) {
        uint32_t bits = 0;
        _Pragma("GCC unroll 16") for (int q = 0; q < 14; q++) {
            if (q + s - 2 >= 0 && q + s - 2 < width) bits |= 1u << q;
        }
        masks[s] = (__mmask16)bits;
    }
}

static inline __attribute__((always_inline)) void block(
    const float *plane, const float *w, float *out, int p, int width, int height,
    const __mmask16 *masks) {
    __m512 acc[BLOCK];
    const float *rows[WINDOW];
    _Pragma("GCC unroll 16") for (int b = 0; b < BLOCK; b++) acc[b] = _mm512_setzero_ps();
    _Pragma("GCC unroll 16") for (int i = 0; i < WINDOW; i++) {
        int r = p - 2 + i;
        rows[i] = (r >= 0 && r < height) ? plane + r * width : 0;
    }
    _Pragma("GCC unroll 16") for (int s = 0; s < TAPS; s++) {
        __mmask16 mask = masks[s];
        __m512 weight[TAPS];
        _Pragma("GCC unroll 16") for (int r = 0; r < TAPS; r++) weight[r] = _mm512_set1_ps(w[r * TAPS + s]);
        _Pragma("GCC unroll 16") for (int i = 0; i < WINDOW; i++) {
            if (!rows[i]) continue;
            __m512 v = _mm512_loadu_ps(rows[i] + s - 2);
            _Pragma("GCC unroll 16") for (int r = 0; r < TAPS; r++) {
                int b = i - r;
                if (b >= 0 && b < BLOCK) acc[b] = _mm512_mask3_fmadd_ps(v, weight[r], acc[b], mask);
            }
        }
    }
    _Pragma("GCC unroll 16") for (int b = 0; b < BLOCK; b++) {
        _mm512_mask_storeu_ps(out + (p + b) * width, 0x3FFF, acc[b]);
    }
}

void run_fixed(const float *x, const float *w, float *y, int channels,
               long repeats) {
    __mmask16 masks[TAPS];
    column_masks(masks, 14);
    for (long t = 0; t < repeats; t++) {
        for (int c = 0; c < channels; c++) {
            block(x + c * 196, w + c * 25, y + c * 196, 0, 14, 14, masks);
            block(x + c * 196, w + c * 25, y + c * 196, 7, 14, 14, masks);
        }
    }
}

void run_runtime(const float *x, const float *w, float *y, int channels,
                 long repeats, int width, int height, int last_block) {
    __mmask16 masks[TAPS];
    column_masks(masks, width);
    for (long t = 0; t < repeats; t++) {
        for (int c = 0; c < channels; c++) {
            const float *plane = x + c * width * height;
            float *out = y + c * width * height;
            for (int p = 0;; p += BLOCK) {
                int start = p < last_block ? p : last_block;
                block(plane, w + c * 25, out, start, width, height, masks);
                if (start == last_block) break;
            }
        }
    }
}
