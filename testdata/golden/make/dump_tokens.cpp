// The ids llama_tokenize gives a text, as llama-embedding asks for them (add_special true:
// BOS/EOS where the vocabulary adds them) or with nothing added (add_special false); special-
// token text parsed in both. Prints a JSON list.
//   dump_tokens VOCAB.gguf TEXT_FILE 0|1
#include "llama.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

static void quiet(ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc != 4) return 2;
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::ifstream f(argv[2], std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const bool add_special = argv[3][0] == '1';
    std::vector<llama_token> ids(text.size() + 8);
    int n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), ids.data(),
                           (int32_t) ids.size(), add_special, true);
    if (n < 0) return 1;
    printf("[");
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
    printf("]\n");
    llama_model_free(model);
    return 0;
}
