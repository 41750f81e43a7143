// ggml's reference quantizers and dequantizers on raw files, for tools/gen_kquant_vectors.py and
// tools/gen_iq_vectors.py.
//
//   G=llama.cpp/ggml; gcc -O2 -I$G/include -I$G/src tools/qref.c -L$BUILD/bin -lggml-base
//       -Wl,-rpath,$BUILD/bin -o qref
//
//   qref 2|3|4|5|6|nl|xs in.f32 out.bin            quantize_row_q{2,3,4,5,6}_K_ref,
//                                                  quantize_iq4_{nl,xs} (no importance matrix)
//   qref q TYPE N_PER_ROW in.f32 out.bin [w.f32]   ggml_quantize_chunk: rows of N_PER_ROW values,
//                                                  importance weights w (N_PER_ROW floats) if given
//   qref deq TYPE in.bin out.f32                   the type's to_float (dequantize_row_*)
//
// TYPE is ggml's type name in any case (iq2_xxs, TQ1_0, mxfp4, ...). These are the functions
// llama-quantize and the CPU backend call. ggml-base is compiled without -march flags, so no FMA
// contraction.
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include "ggml.h"
#include "ggml-quants.h"

static void * slurp(const char * path, long * n_bytes) {
    FILE * f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END); *n_bytes = ftell(f); fseek(f, 0, SEEK_SET);
    void * p = malloc(*n_bytes + 1);
    if (fread(p, 1, *n_bytes, f) != (size_t) *n_bytes) { fprintf(stderr, "%s: short read\n", path); exit(1); }
    fclose(f);
    return p;
}

static void spill(const char * path, const void * p, size_t n) {
    FILE * o = fopen(path, "wb");
    if (!o || fwrite(p, 1, n, o) != n) { perror(path); exit(1); }
    fclose(o);
}

static enum ggml_type type_named(const char * name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * tn = ggml_type_name((enum ggml_type) t);
        if (!tn || ggml_blck_size((enum ggml_type) t) == 0) continue;
        size_t i = 0;
        while (tn[i] && name[i] && tolower((unsigned char) tn[i]) == tolower((unsigned char) name[i])) ++i;
        if (!tn[i] && !name[i]) return (enum ggml_type) t;
    }
    fprintf(stderr, "unknown type %s\n", name);
    exit(2);
}

int main(int argc, char ** argv) {
    if (argc >= 6 && !strcmp(argv[1], "q")) {
        enum ggml_type t = type_named(argv[2]);
        long per_row = atol(argv[3]), nb;
        float * x = slurp(argv[4], &nb);
        long n = nb / 4;
        if (per_row <= 0 || n % per_row) { fprintf(stderr, "%ld values are not rows of %ld\n", n, per_row); return 1; }
        const float * w = NULL;
        if (argc >= 7) {
            long nw;
            w = slurp(argv[6], &nw);
            if (nw != per_row * 4) { fprintf(stderr, "weights: %ld bytes, want %ld\n", nw, per_row * 4); return 1; }
        }
        if (ggml_quantize_requires_imatrix(t) && !w) { fprintf(stderr, "%s needs importance weights\n", argv[2]); return 1; }
        size_t size = ggml_row_size(t, per_row) * (n / per_row);
        void * y = calloc(size + 1, 1);
        size_t done = ggml_quantize_chunk(t, x, y, 0, n / per_row, per_row, w);
        if (done != size) { fprintf(stderr, "wrote %zu of %zu bytes\n", done, size); return 1; }
        spill(argv[5], y, size);
        return 0;
    }
    if (argc == 5 && !strcmp(argv[1], "deq")) {
        enum ggml_type t = type_named(argv[2]);
        long nb;
        void * x = slurp(argv[3], &nb);
        size_t ts = ggml_type_size(t), bs = ggml_blck_size(t);
        if (nb % ts) { fprintf(stderr, "%ld bytes are not whole %zu-byte blocks\n", nb, ts); return 1; }
        long n = nb / ts * bs;
        float * y = malloc(n * sizeof(float) + 1);
        ggml_get_type_traits(t)->to_float(x, y, n);
        spill(argv[4], y, n * sizeof(float));
        return 0;
    }
    if (argc != 4) { fprintf(stderr, "usage: qref 2|3|4|5|6|nl|xs in.f32 out.bin | q TYPE N_PER_ROW in.f32 out.bin [w.f32] | deq TYPE in.bin out.f32\n"); return 2; }
    int t = argv[1][0] == 'n' ? 10 : argv[1][0] == 'x' ? 11 : atoi(argv[1]);
    long nbytes;
    float * x = slurp(argv[2], &nbytes);
    long n = nbytes / 4;
    size_t nb = n / 256, sz = 0;
    void * y = calloc(nb + 8, 512);
    switch (t) {
        case 2: quantize_row_q2_K_ref(x, y, n); sz = sizeof(block_q2_K); break;
        case 3: quantize_row_q3_K_ref(x, y, n); sz = sizeof(block_q3_K); break;
        case 4: quantize_row_q4_K_ref(x, y, n); sz = sizeof(block_q4_K); break;
        case 5: quantize_row_q5_K_ref(x, y, n); sz = sizeof(block_q5_K); break;
        case 6: quantize_row_q6_K_ref(x, y, n); sz = sizeof(block_q6_K); break;
        case 10: quantize_iq4_nl(x, y, 1, n, NULL); sz = sizeof(block_iq4_nl); nb = n / 32; break;
        case 11: quantize_iq4_xs(x, y, 1, n, NULL); sz = sizeof(block_iq4_xs); break;
        default: fprintf(stderr, "type %d?\n", t); return 2;
    }
    spill(argv[3], y, sz * nb);
    return 0;
}
