// ggml's reference K-quant quantizers on a raw f32 file, for tools/gen_kquant_vectors.py.
//
//   gcc -O2 -DNDEBUG -I$GGML/include -I$GGML/src tools/qref.c $GGML/src/ggml-quants.c \
//       $GGML/src/ggml.c ... (see gen_kquant_vectors.py) -o qref
//   qref 2|3|4|5|6|nl|xs in.f32 out.bin
//
// Calls quantize_row_q{2,3,4,5,6}_K_ref and quantize_iq4_{nl,xs} (no importance matrix), the
// functions llama-quantize calls without an importance matrix. ggml-quants.c is compiled without -march flags (as ggml-base is), so no FMA contraction.
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include "ggml-quants.h"

int main(int argc, char ** argv) {
    if (argc != 4) { fprintf(stderr, "usage: qref 2|3|4|5|6|nl|xs in.f32 out.bin\n"); return 2; }
    int t = argv[1][0] == 'n' ? 10 : argv[1][0] == 'x' ? 11 : atoi(argv[1]);
    FILE * f = fopen(argv[2], "rb");
    if (!f) { perror(argv[2]); return 1; }
    fseek(f, 0, SEEK_END); long n = ftell(f) / 4; fseek(f, 0, SEEK_SET);
    float * x = malloc(n * sizeof(float));
    if (fread(x, 4, n, f) != (size_t) n) { fprintf(stderr, "short read\n"); return 1; }
    fclose(f);
    size_t nb = n / 256, sz = 0;
    void * y = calloc(nb, 512);
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
    FILE * o = fopen(argv[3], "wb");
    if (!o || fwrite(y, sz, nb, o) != nb) { perror(argv[3]); return 1; }
    fclose(o);
    return 0;
}
