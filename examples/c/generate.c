/*
 * Load a model, generate greedily from a prompt, print the token ids.
 *
 *   cc generate.c -I include -L target/release -lbitnet -Wl,-rpath,target/release -o generate
 *   ./generate model.gguf "The capital of France is" 32 [exact]
 *
 * stdout: "ids: ..." (the generated token ids), then "next: N" (the first token again,
 * chosen from bitnet_forward's logits by a greedy sampler). stderr: the text as it streams.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bitnet.h"

static bool on_piece(const char *text, size_t len, void *user_data) {
    size_t *bytes = user_data;
    *bytes += len;
    fwrite(text, 1, len, stderr);
    return true; /* false would stop the generation */
}

static int fail(const char *what) {
    fprintf(stderr, "%s failed: %s\n", what, bitnet_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL PROMPT N_TOKENS [exact]\n", argv[0]);
        return 2;
    }
    bitnet_config cfg = bitnet_config_default();
    cfg.n_threads = 1;
    cfg.n_ctx = 512;
    if (argc > 4 && strcmp(argv[4], "exact") == 0) cfg.numerics = BITNET_NUMERICS_EXACT;

    bitnet_engine *engine = NULL;
    if (bitnet_load(argv[1], &cfg, &engine) != BITNET_OK) return fail("bitnet_load");

    bitnet_gen_params params = bitnet_gen_params_default();
    params.temperature = 0.0f; /* greedy */
    params.max_tokens = (uint32_t)atoi(argv[3]);

    uint32_t ids[1024];
    size_t bytes = 0;
    bitnet_gen_result res;
    if (bitnet_generate(engine, argv[2], &params, on_piece, &bytes, ids, 1024, &res) != BITNET_OK)
        return fail("bitnet_generate");
    fprintf(stderr, "\n[%llu tokens, %.1f tok/s, %zu bytes of text, finish %d]\n",
            (unsigned long long)res.n_generated, res.gen_tok_per_s, bytes, res.finish);
    printf("ids:");
    for (uint64_t i = 0; i < res.n_generated && i < 1024; i++) printf(" %u", ids[i]);
    printf("\n");

    /* The same first token through tokenize -> forward -> sampler. */
    size_t n = 0;
    uint32_t prompt[512];
    if (bitnet_tokenize(engine, argv[2], true, false, prompt, 512, &n) != BITNET_OK)
        return fail("bitnet_tokenize");
    bitnet_info info;
    if (bitnet_info_get(engine, &info) != BITNET_OK) return fail("bitnet_info_get");
    float *logits = malloc(info.n_vocab * sizeof(float));
    if (logits == NULL) return 1;
    if (bitnet_forward(engine, prompt, n, logits, info.n_vocab) != BITNET_OK)
        return fail("bitnet_forward");
    bitnet_sampler *sampler = NULL;
    if (bitnet_sampler_new(&params, &sampler) != BITNET_OK) return fail("bitnet_sampler_new");
    uint32_t next = 0;
    if (bitnet_sampler_sample(sampler, logits, info.n_vocab, &next) != BITNET_OK)
        return fail("bitnet_sampler_sample");
    printf("next: %u\n", next);

    bitnet_stats stats;
    if (bitnet_stats_get(engine, &stats) != BITNET_OK) return fail("bitnet_stats_get");
    fprintf(stderr, "[peak RSS %llu bytes]\n", (unsigned long long)stats.peak_rss_bytes);

    bitnet_sampler_free(sampler);
    free(logits);
    bitnet_free(engine);
    return 0;
}
