/* The micro-kernel's ceiling on this machine, written independently of cso.
 *
 * Built and run by experiments/kernel_ceiling.py (gcc -O3 -march=native).
 * Each kernel is cso's outer-product micro-kernel written by hand with
 * AVX-512 intrinsics: an Nf x Nwin tile of accumulators in registers, one
 * rank-1 update per reduction step, operands L1-resident.  If these reach
 * the same share of the FMA peak as cso's generated LLVM kernels, the gap
 * to the peak is the machine's (loads issued beside two FMAs per cycle),
 * not cso's code generation.  "no loads" is the same 8x32 loop with its
 * operands held in registers: the FMA peak with this loop's shape.
 *
 * Usage: kernel_ceiling DEPTH SECONDS  -> one line per kernel: name GFLOP/s
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Windows in the vectors: filters[k][MR] broadcast, inputs[k][NV*16] loaded. */
#define WINDOWS(NAME, MR, NV)                                                        \
    __attribute__((noinline)) static void NAME(int depth, const float *filters,      \
                                               const float *inputs, float *out) {    \
        __m512 acc[MR * NV];                                                         \
        for (int i = 0; i < MR * NV; i++) acc[i] = _mm512_setzero_ps();              \
        for (int k = 0; k < depth; k++) {                                            \
            __m512 row[NV];                                                          \
            for (int v = 0; v < NV; v++) row[v] = _mm512_load_ps(inputs + (k * NV + v) * 16); \
            for (int i = 0; i < MR; i++) {                                           \
                __m512 f = _mm512_set1_ps(filters[k * MR + i]);                      \
                for (int v = 0; v < NV; v++)                                         \
                    acc[i * NV + v] = _mm512_fmadd_ps(f, row[v], acc[i * NV + v]);   \
            }                                                                        \
        }                                                                            \
        for (int i = 0; i < MR * NV; i++)                                            \
            _mm512_store_ps(out + 16 * i, _mm512_add_ps(_mm512_load_ps(out + 16 * i), acc[i])); \
    }

/* Filters in the vectors: filters[k][NV*16] loaded, inputs[k][NW] broadcast. */
#define FILTERS(NAME, NV, NW)                                                        \
    __attribute__((noinline)) static void NAME(int depth, const float *filters,      \
                                               const float *inputs, float *out) {    \
        __m512 acc[NW * NV];                                                         \
        for (int i = 0; i < NW * NV; i++) acc[i] = _mm512_setzero_ps();              \
        for (int k = 0; k < depth; k++) {                                            \
            __m512 row[NV];                                                          \
            for (int v = 0; v < NV; v++) row[v] = _mm512_load_ps(filters + (k * NV + v) * 16); \
            for (int j = 0; j < NW; j++) {                                           \
                __m512 x = _mm512_set1_ps(inputs[k * NW + j]);                       \
                for (int v = 0; v < NV; v++)                                         \
                    acc[j * NV + v] = _mm512_fmadd_ps(x, row[v], acc[j * NV + v]);   \
            }                                                                        \
        }                                                                            \
        for (int i = 0; i < NW * NV; i++)                                            \
            _mm512_store_ps(out + 16 * i, _mm512_add_ps(_mm512_load_ps(out + 16 * i), acc[i])); \
    }

WINDOWS(windows_8x32, 8, 2)
WINDOWS(windows_14x32, 14, 2)
WINDOWS(windows_6x64, 6, 4)
FILTERS(filters_32x14, 2, 14)

__attribute__((noinline)) static void no_loads_8x32(int depth, const float *filters,
                                                    const float *inputs, float *out) {
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    __m512 a = _mm512_load_ps(inputs), b = _mm512_load_ps(inputs + 16);
    (void)filters;
    for (int k = 0; k < depth; k++) {
        for (int i = 0; i < 8; i++) {
            acc[2 * i] = _mm512_fmadd_ps(a, b, acc[2 * i]);
            acc[2 * i + 1] = _mm512_fmadd_ps(b, a, acc[2 * i + 1]);
        }
        /* Keeps a and b opaque, so the loop is not folded away. */
        __asm__ volatile("" : "+v"(a), "+v"(b));
    }
    for (int i = 0; i < 16; i++)
        _mm512_store_ps(out + 16 * i, _mm512_add_ps(_mm512_load_ps(out + 16 * i), acc[i]));
}

typedef void (*kernel_fn)(int, const float *, const float *, float *);

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DEPTH SECONDS\n", argv[0]);
        return 2;
    }
    int depth = atoi(argv[1]);
    double seconds = atof(argv[2]);
    struct { const char *name; kernel_fn run; int tile; } kernels[] = {
        {"8x32w", windows_8x32, 8 * 32},
        {"14x32w", windows_14x32, 14 * 32},
        {"6x64w", windows_6x64, 6 * 64},
        {"32x14f", filters_32x14, 32 * 14},
        {"no loads 8x32", no_loads_8x32, 8 * 32},
    };
    float *filters = aligned_alloc(64, (size_t)depth * 32 * sizeof(float));
    float *inputs = aligned_alloc(64, (size_t)depth * 64 * sizeof(float));
    float *out = aligned_alloc(64, 32 * 16 * sizeof(float));
    for (int i = 0; i < depth * 32; i++) filters[i] = 1e-6f;
    for (int i = 0; i < depth * 64; i++) inputs[i] = 1e-6f;
    for (int i = 0; i < 32 * 16; i++) out[i] = 0.0f;
    for (size_t n = 0; n < sizeof kernels / sizeof kernels[0]; n++) {
        double flops = 2.0 * kernels[n].tile * depth;
        long calls = (long)(seconds * 2e11 / flops) + 1;
        double best = 1e30;
        for (int round = 0; round < 5; round++) {
            double start = now();
            for (long c = 0; c < calls; c++) kernels[n].run(depth, filters, inputs, out);
            double elapsed = now() - start;
            if (elapsed < best) best = elapsed;
        }
        printf("%s %.3f\n", kernels[n].name, flops * calls / best / 1e9);
    }
    /* Printed so the accumulations are not dead code. */
    fprintf(stderr, "checksum %g\n", out[0]);
    free(filters);
    free(inputs);
    free(out);
    return 0;
}
