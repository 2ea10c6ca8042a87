# Sourced by convert-env.sh and ../../trained/make-refs.sh: bitnet.cpp's converters run in a
# virtual environment under $REF ($venv) with the versions bitnet.cpp's requirements pin where
# PyPI still serves them (transformers >=4.46.3,<5, numpy ~1.26.4, sentencepiece ~0.2.0,
# protobuf <5) and the current torch (its pinned ~2.2.1 comes from PyTorch's own index; torch
# only unpacks and divides here). It is made when missing.
venv=$REF/convert-venv
if [[ ! -x $venv/bin/python ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch 'transformers>=4.46.3,<5.0.0' 'numpy~=1.26.4' \
    'sentencepiece~=0.2.0' 'protobuf>=4.21.0,<5.0.0' safetensors
fi
