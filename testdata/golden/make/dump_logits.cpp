// Reference logits from bitnet.cpp's llama.cpp fork, in the layout of testdata/golden/tiny:
//   dump_logits MODEL.gguf PROMPT.txt OUT_PREFIX [N_GEN=32] [THREADS=1]
// writes OUT_PREFIX.tokens.json, .logits.f32 (last prompt position, prompt in one batch),
// .step_logits.f32 (N_GEN rows: row 0 = .logits.f32, row s = after feeding greedy token s-1
// alone) and .all_logits.f32 (every prompt position, from a second context that asks for all).
// Greedy = argmax of the raw logits, lowest id on ties; no stop at EOS.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void die(const char * what) { fprintf(stderr, "dump_logits: %s\n", what); exit(1); }

static llama_context * new_ctx(llama_model * model, int threads) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn = false;
    llama_context * ctx = llama_new_context_with_model(model, cp);
    if (!ctx) die("cannot create a context");
    return ctx;
}

// Decode tokens at positions pos0.. in one batch; want_all: logits for every row, else the last.
static void decode(llama_context * ctx, const std::vector<llama_token> & toks, int pos0, bool want_all) {
    llama_batch b = llama_batch_init((int32_t) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        b.token[i] = toks[i];
        b.pos[i] = pos0 + (int) i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = want_all || i + 1 == toks.size();
    }
    b.n_tokens = (int32_t) toks.size();
    if (llama_decode(ctx, b) != 0) die("llama_decode failed");
    llama_batch_free(b);
}

static void write_f32(const std::string & path, const std::vector<float> & v) {
    FILE * f = fopen(path.c_str(), "wb");
    if (!f || fwrite(v.data(), sizeof(float), v.size(), f) != v.size()) die("cannot write output");
    fclose(f);
}

static std::string hex(const std::string & s) {
    static const char * d = "0123456789abcdef";
    std::string o;
    for (unsigned char c : s) { o += d[c >> 4]; o += d[c & 15]; }
    return o;
}

int main(int argc, char ** argv) {
    if (argc < 4) die("usage: dump_logits MODEL PROMPT OUT_PREFIX [N_GEN] [THREADS]");
    const std::string out = argv[3];
    const int n_gen = argc > 4 ? atoi(argv[4]) : 32;
    const int threads = argc > 5 ? atoi(argv[5]) : 1;
    std::ifstream in(argv[2], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_load_model_from_file(argv[1], mp);
    if (!model) die("cannot load the model");
    const int n_vocab = llama_n_vocab(model);

    std::vector<llama_token> prompt(text.size() + 16);
    int n = llama_tokenize(model, text.data(), (int32_t) text.size(), prompt.data(),
                           (int32_t) prompt.size(), /*add_special*/ true, /*parse_special*/ true);
    if (n < 0) die("tokenize failed");
    prompt.resize(n);

    auto argmax = [&](const float * l) {
        int best = 0;
        for (int i = 1; i < n_vocab; i++) if (l[i] > l[best]) best = i;
        return best;
    };

    // last position, then N_GEN-1 one-token steps
    llama_context * ctx = new_ctx(model, threads);
    decode(ctx, prompt, 0, false);
    std::vector<float> steps;
    std::vector<llama_token> gen;
    for (int s = 0; s < n_gen; s++) {
        const float * l = llama_get_logits_ith(ctx, -1);
        if (!l) die("no logits");
        steps.insert(steps.end(), l, l + n_vocab);
        gen.push_back(argmax(l));
        if (s + 1 < n_gen) decode(ctx, {gen.back()}, n + s, false);
    }
    llama_free(ctx);
    write_f32(out + ".logits.f32", std::vector<float>(steps.begin(), steps.begin() + n_vocab));
    write_f32(out + ".step_logits.f32", steps);

    // every prompt position, fresh context
    ctx = new_ctx(model, threads);
    decode(ctx, prompt, 0, true);
    std::vector<float> all;
    for (int i = 0; i < n; i++) {
        const float * l = llama_get_logits_ith(ctx, i);
        if (!l) die("no logits");
        all.insert(all.end(), l, l + n_vocab);
    }
    llama_free(ctx);
    write_f32(out + ".all_logits.f32", all);

    std::ofstream js(out + ".tokens.json");
    js << "{\n  \"n_vocab\": " << n_vocab << ",\n  \"prompt_tokens\": [";
    for (int i = 0; i < n; i++) js << (i ? ", " : "") << prompt[i];
    js << "],\n  \"generated_tokens\": [";
    for (size_t i = 0; i < gen.size(); i++) js << (i ? ", " : "") << gen[i];
    js << "],\n  \"generated_pieces_hex\": [";
    for (size_t i = 0; i < gen.size(); i++) {
        char buf[256];
        int k = llama_token_to_piece(model, gen[i], buf, sizeof buf, 0, true);
        js << (i ? ", " : "") << "\"" << hex(std::string(buf, k > 0 ? k : 0)) << "\"";
    }
    js << "]\n}\n";
    llama_free_model(model);
    return 0;
}
