// Prompts from bitnet.cpp's llama_chat_apply_template for the chat formats of the `llama`
// models it runs, as JSON: dump_chat > chat-formats.json
#include "llama.h"

#include <cstdio>
#include <string>
#include <vector>

static std::string json_str(const std::string & s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"' || c == '\\') { o += '\\'; o += (char) c; }
        else if (c == '\n') o += "\\n";
        else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
        else o += (char) c;
    }
    return o + "\"";
}

int main() {
    // Contents with surrounding spaces (LLaMA-3's template trims them) and marker text.
    std::vector<llama_chat_message> chat = {
        {"system", "You are a helpful assistant."},
        {"user", "  Hi there!\n"},
        {"assistant", "Hello. <|eot_id|> is just text here."},
        {"user", "What is 2+2?"},
    };
    printf("[\n");
    const char * names[] = {"llama3", "falcon3"};
    for (int i = 0; i < 2; i++) {
        for (int add = 0; add <= 1; add++) {
            std::vector<char> buf(4096);
            int n = llama_chat_apply_template(nullptr, names[i], chat.data(), chat.size(), add,
                                              buf.data(), (int32_t) buf.size());
            if (n < 0 || n > (int) buf.size()) return 1;
            printf(" {\"format\": \"%s\", \"add_generation_prompt\": %s, \"prompt\": %s}%s\n",
                   names[i], add ? "true" : "false", json_str(std::string(buf.data(), n)).c_str(),
                   i == 1 && add == 1 ? "" : ",");
        }
    }
    printf("]\n");
    return 0;
}
