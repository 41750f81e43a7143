// llama_logits: llama.cpp's logits of windows of tokens, as f32, for
// tools/fidelity_reference.py (built and run by it against the shared
// llama.cpp build; see its docstring).
//
//   llama_logits MODEL.gguf TOKENS.i32 N_CTX MODE THREADS OUT.f32
//
// TOKENS.i32 holds windows of N_CTX tokens (int32, native order); each
// window is evaluated from an empty memory and the logits of all its
// positions are appended to OUT.f32 as [N_CTX][n_vocab] f32. MODE is how the
// window is fed:
//   prompt  the whole window in one batch (one micro-batch);
//   token   one token per llama_decode call (as decoding runs);
//   batch4  four windows side by side, one token of each per call (batched
//           decoding of four sequences).
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *msg) {
    fprintf(stderr, "llama_logits: %s\n", msg);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        die("usage: llama_logits MODEL TOKENS.i32 N_CTX prompt|token|batch4 THREADS OUT.f32");
    }
    const char *mode = argv[4];
    const int n_ctx = atoi(argv[3]);
    const int threads = atoi(argv[5]);
    const int n_par = strcmp(mode, "batch4") == 0 ? 4 : 1;
    if (n_ctx < 4) die("N_CTX must be at least 4");
    if (strcmp(mode, "prompt") && strcmp(mode, "token") && strcmp(mode, "batch4")) die("unknown MODE");

    FILE *tf = fopen(argv[2], "rb");
    if (!tf) die("cannot open the tokens");
    fseek(tf, 0, SEEK_END);
    long bytes = ftell(tf);
    fseek(tf, 0, SEEK_SET);
    const int n_tok = (int)(bytes / 4);
    const int n_win = n_tok / n_ctx;
    if (n_win < 1) die("fewer tokens than one window");
    llama_token *tokens = malloc(sizeof(llama_token) * (size_t)n_tok);
    if (fread(tokens, 4, (size_t)n_tok, tf) != (size_t)n_tok) die("short read of the tokens");
    fclose(tf);

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) die("cannot load the model");
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_ctx * n_par);
    cp.n_batch = (uint32_t)n_ctx;
    cp.n_ubatch = (uint32_t)n_ctx;
    cp.n_seq_max = (uint32_t)n_par;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create a context");

    FILE *out = fopen(argv[6], "wb");
    if (!out) die("cannot create the output");
    const int rows = n_ctx;
    float *keep = malloc(sizeof(float) * (size_t)n_par * (size_t)rows * (size_t)n_vocab);
    struct llama_batch batch = llama_batch_init(n_ctx, 0, n_par);

    for (int w0 = 0; w0 + n_par <= n_win; w0 += n_par) {
        llama_memory_clear(llama_get_memory(ctx), true);
        if (n_par == 1 && strcmp(mode, "prompt") == 0) {
            batch.n_tokens = n_ctx;
            for (int i = 0; i < n_ctx; i++) {
                batch.token[i] = tokens[(size_t)w0 * n_ctx + i];
                batch.pos[i] = i;
                batch.n_seq_id[i] = 1;
                batch.seq_id[i][0] = 0;
                batch.logits[i] = 1;
            }
            if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
            for (int i = 0; i < n_ctx; i++) {
                memcpy(keep + (size_t)i * n_vocab, llama_get_logits_ith(ctx, i),
                       sizeof(float) * (size_t)n_vocab);
            }
        } else {
            for (int i = 0; i < n_ctx; i++) {
                batch.n_tokens = n_par;
                for (int s = 0; s < n_par; s++) {
                    batch.token[s] = tokens[(size_t)(w0 + s) * n_ctx + i];
                    batch.pos[s] = i;
                    batch.n_seq_id[s] = 1;
                    batch.seq_id[s][0] = s;
                    batch.logits[s] = 1;
                }
                if (llama_decode(ctx, batch) != 0) die("llama_decode failed");
                for (int s = 0; s < n_par; s++) {
                    memcpy(keep + ((size_t)s * rows + (size_t)i) * n_vocab, llama_get_logits_ith(ctx, s),
                           sizeof(float) * (size_t)n_vocab);
                }
            }
        }
        fwrite(keep, sizeof(float), (size_t)n_par * rows * n_vocab, out);
    }
    fclose(out);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    free(keep);
    free(tokens);
    return 0;
}
