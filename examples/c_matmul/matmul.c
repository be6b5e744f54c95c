/*
 * A conformant fp32 matmul in plain C, checked through refreplay's exec
 * protocol (docs/conformance.md):
 *
 *     gcc -O2 -ffp-contract=off -o matmul matmul.c
 *     refreplay conform exec:./matmul --op matmul
 *
 * The program is called as `matmul DIR`.  DIR/case.txt names the op and the
 * tensors; inputs are raw little-endian files DIR/in_A.bin and DIR/in_B.bin;
 * the output goes to DIR/out_C.bin.  Ops other than matmul exit with status
 * 3 ("not implemented").
 *
 * What makes it conformant (refreplay spec chapter 1 and [mm.nn.c1]):
 *   - inputs are loaded as [num.load.c1] says: subnormals zeroed, NaN canonical;
 *   - every output is a sequential sum over k increasing, from -0 ([red.sum.c1]);
 *   - every product and every partial sum is rounded separately ([num.nofma.c1]):
 *     this source writes `s + a * b`, which a compiler may contract into a fused
 *     multiply-add unless told not to: -ffp-contract=off.  Built with
 *     -ffp-contract=fast on a machine with FMA, the same source fails the
 *     suite's multiply-add probes;
 *   - results are flushed after rounding ([num.flush.c1]); a product can be
 *     subnormal only when both exponents are small, so an output whose
 *     products are all safely normal takes a loop that flushes only the sums;
 *   - the final NaN is canonicalised once at the end of the chain ([num.nan.c1]).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_UNSUPPORTED 3

static float flush(float x) { return fabsf(x) < FLT_MIN ? x * 0.0f : x; }

static float canon(float x)
{
    if (x != x) {
        uint32_t q = 0x7FC00000u;
        memcpy(&x, &q, sizeof x);
    }
    return x;
}

static unsigned biased_exponent(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u >> 23) & 0xFF;
}

/* The product of a and b is subnormal-or-tiny only if both are non-zero
 * finite numbers whose biased exponents sum to less than 128. */
static int may_be_subnormal(float a, float b)
{
    unsigned ea = biased_exponent(a), eb = biased_exponent(b);
    return ea != 0 && eb != 0 && ea != 255 && eb != 255 && ea + eb < 128;
}

static void die(const char *what, const char *arg)
{
    fprintf(stderr, "matmul: %s %s\n", what, arg);
    exit(1);
}

static float *read_f32(const char *dir, const char *file, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open", path);
    float *x = malloc(n * sizeof *x + 1);
    if (fread(x, sizeof *x, n, f) != n) die("short read", path);
    fclose(f);
    for (size_t i = 0; i < n; i++) /* [num.load.c1] */
        x[i] = canon(flush(x[i]));
    return x;
}

int main(int argc, char **argv)
{
    if (argc != 2) die("usage: matmul", "CASE_DIR");
    const char *dir = argv[1];
    char path[4096], line[512], word[32], name[64], dtype[16], file[256];
    snprintf(path, sizeof path, "%s/case.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) die("cannot open", path);
    size_t I = 0, K = 0, K2 = 0, J = 0;
    char fa[256] = "", fb[256] = "", fc[256] = "";
    while (fgets(line, sizeof line, f)) {
        unsigned long d0 = 0, d1 = 0;
        int ndim = 0;
        if (sscanf(line, "%31s", word) != 1) continue;
        if (!strcmp(word, "op")) {
            sscanf(line, "op %63s", name);
            if (strcmp(name, "matmul")) return EXIT_UNSUPPORTED;
        } else if (!strcmp(word, "input") || !strcmp(word, "output")) {
            if (sscanf(line, "%*s %63s %15s %d %lu %lu %255s", name, dtype, &ndim, &d0, &d1, file) != 6
                || ndim != 2 || strcmp(dtype, "f32"))
                die("unexpected tensor line:", line);
            if (!strcmp(name, "A")) { I = d0; K = d1; strcpy(fa, file); }
            else if (!strcmp(name, "B")) { K2 = d0; J = d1; strcpy(fb, file); }
            else if (!strcmp(name, "C")) strcpy(fc, file);
        }
    }
    fclose(f);
    if (K != K2 || !*fa || !*fb || !*fc) die("inconsistent case", path);
    float *A = read_f32(dir, fa, I * K), *B = read_f32(dir, fb, K * J);
    float *C = malloc(I * J * sizeof *C + 1);

    for (size_t i = 0; i < I; i++)
        for (size_t j = 0; j < J; j++) {
            const float *a = A + i * K, *b = B + j;
            int tiny = 0;
            for (size_t k = 0; k < K; k++)
                tiny |= may_be_subnormal(a[k], b[k * J]);
            float s = K ? -0.0f : 0.0f; /* [red.sum.c1]: start from -0, k increasing; the empty sum is +0 */
            if (tiny)        /* rare: some product may be subnormal and must be flushed */
                for (size_t k = 0; k < K; k++) {
                    float p = a[k] * b[k * J];
                    s = flush(s + flush(p));
                }
            else             /* every product is normal, zero, inf or NaN: flushing it is a no-op */
                for (size_t k = 0; k < K; k++)
                    s = flush(s + a[k] * b[k * J]);
            C[i * J + j] = canon(s);
        }

    snprintf(path, sizeof path, "%s/%s", dir, fc);
    f = fopen(path, "wb");
    if (!f || fwrite(C, sizeof *C, I * J, f) != I * J) die("cannot write", path);
    fclose(f);
    free(A); free(B); free(C);
    return 0;
}
