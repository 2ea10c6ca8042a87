#!/usr/bin/env python3
"""Run bitnet.cpp's own embedding converter (microsoft/BitNet utils/convert-bitnet-embedding-to-gguf.py)
on a synthetic checkpoint from embed_hf.py:

  PYTHONPATH=GGUF_PY_DIR embed_convert.py CONVERTER.py MODEL_DIR --outtype i2_s|f32|f16 --outfile OUT.gguf

e.g.  git -C $MIRROR/microsoft+BitNet/repo show HEAD:utils/convert-bitnet-embedding-to-gguf.py \
          > /tmp/embed-ref/convert-bitnet-embedding-to-gguf.py
      PYTHONPATH=$REF/bitnet.cpp/3rdparty/llama.cpp/gguf-py $REF/convert-venv/bin/python \
          embed_convert.py /tmp/embed-ref/convert-bitnet-embedding-to-gguf.py /tmp/embed-ref/hf-qwen3 \
          --outtype i2_s --outfile /tmp/embed-ref/qwen3-i2_s.gguf

The converter module is imported and run unchanged, except for:
  * get_vocab_base_pre: the converter identifies the pre-tokenizer by hashing the token ids of a
    fixed text, and only the real Qwen3 vocabulary passes. When the hash is not recognised (a
    synthetic vocabulary), this wrapper returns "qwen2" -- the pre-tokenizer the synthetic
    tokenizer.json really uses (Qwen2's split regex). A recognised hash is returned unchanged.
  * gguf-py: bitnet.cpp's bundled gguf-py (3rdparty/llama.cpp/gguf-py) has neither
    GGMLQuantizationType.I2_S (36) nor PoolingType.LAST (3), both of which the converter uses
    (the llama.cpp branch release-bitnet-embedding-0.6b-270m that the guide names presumably has
    them). When they are missing they are added here (same names, same values: 36 as in bitnet.cpp's
    ggml, 3 as in llama.cpp's LLAMA_POOLING_TYPE_LAST); nothing else of gguf-py is changed.
"""
import enum
import importlib.util
import logging
import sys

import gguf
import gguf.constants

log = logging.getLogger("embed_convert")


def _extend_enum(enum_cls, extra):
    missing = {k: v for k, v in extra.items() if not hasattr(enum_cls, k)}
    if not missing:
        return enum_cls, []
    members = {m.name: m.value for m in enum_cls}
    members.update(missing)
    return enum.IntEnum(enum_cls.__name__, members), sorted(missing)


def patch_gguf():
    added = []
    qt, miss = _extend_enum(gguf.GGMLQuantizationType, {"I2_S": 36})
    if miss:
        gguf.GGMLQuantizationType = gguf.constants.GGMLQuantizationType = qt
        # size bookkeeping only (block 1, 1 byte): the converter hands the writer raw packed bytes
        # (n/4 + 32 of them) and the writer takes nbytes from the array
        gguf.constants.GGML_QUANT_SIZES.setdefault(qt.I2_S, (1, 1))
        added += [f"GGMLQuantizationType.{m}" for m in miss]
    pt, miss = _extend_enum(gguf.PoolingType, {"LAST": 3})
    if miss:
        gguf.PoolingType = gguf.constants.PoolingType = pt
        added += [f"PoolingType.{m}" for m in miss]
    return added


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    conv_path = sys.argv[1]
    added = patch_gguf()
    spec = importlib.util.spec_from_file_location("convert_bitnet_embedding", conv_path)
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)

    original = conv.get_vocab_base_pre

    def get_vocab_base_pre(tokenizer, arch):
        try:
            return original(tokenizer, arch)
        except NotImplementedError:
            if arch != "qwen3":
                raise
            log.warning("embed_convert: pre-tokenizer hash not recognised (synthetic vocabulary): "
                        "using 'qwen2', the split the synthetic tokenizer.json uses")
            return "qwen2"

    conv.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [conv_path] + sys.argv[2:]
    if added:
        print(f"embed_convert: gguf-py lacked {', '.join(added)}; added", file=sys.stderr)
    conv.main()


if __name__ == "__main__":
    main()
