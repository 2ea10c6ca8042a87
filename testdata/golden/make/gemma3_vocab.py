#!/usr/bin/env python3
"""Write the vocabulary bitnet.cpp's embedding converter (microsoft/BitNet
utils/convert-bitnet-embedding-to-gguf.py) makes of a Gemma 3 checkpoint, without tensors:

  PYTHONPATH=GGUF_PY_DIR gemma3_vocab.py CONVERTER.py MODEL_DIR OUT.gguf

MODEL_DIR holds a `gemma3_text` config.json (with modules.json and 1_Pooling/ as a
sentence-transformers checkpoint has them) and the tokenizer (tokenizer.json,
tokenizer_config.json). The converter's own functions write the file, in the order its main()
calls them: set_gguf_parameters (the header keys, pooling included) then set_vocab (for
gemma3_text: _set_vocab_gemma3, SentencePiece-style, scores from the merge ranks, then gguf-py's
SpecialVocab). Its tensor loop is not run, so torch, which only that loop uses, is not imported:
the module is loaded with a stand-in for it. The I2_S and LAST-pooling enum members the
converter names are added to gguf-py as embed_convert.py adds them. The result is what
vocab_only.py would make of the converter's full output (its metadata, no tensors).
"""
import importlib.util
import json
import sys
import types
from pathlib import Path

from transformers import AutoTokenizer  # noqa: F401  (loaded before the torch stand-in)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf  # noqa: E402
from embed_convert import patch_gguf  # noqa: E402


def main():
    conv_path, model_dir, out = sys.argv[1:4]
    patch_gguf()
    sys.modules.setdefault("torch", types.ModuleType("torch"))
    spec = importlib.util.spec_from_file_location("convert_bitnet_embedding", conv_path)
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    d = Path(model_dir)
    hparams = json.loads((d / "config.json").read_text())
    assert hparams["model_type"] == "gemma3_text", hparams["model_type"]
    w = gguf.GGUFWriter(out, conv.SUPPORTED_ARCHS["gemma3_text"])
    conv.set_gguf_parameters(w, hparams, d, 40)  # 40: LLAMA_FTYPE_MOSTLY_I2_S, as --outtype i2_s
    conv.set_vocab(w, d, hparams, "gemma3_text")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


if __name__ == "__main__":
    main()
