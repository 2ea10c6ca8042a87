# Sourced by the convert-*.sh scripts: the folders, the converter's virtual environment, the
# bitnet binary and a scratch folder removed on exit.
#
# The converter runs in the virtual environment of convert-venv.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
REF=${REF:?set REF as for llama-tiny.sh}
src=$REF/bitnet.cpp
. "$(dirname "${BASH_SOURCE[0]}")/convert-venv.sh"
bitnet=${BITNET:-$root/target/release/bitnet}
[[ -x $bitnet ]] || (cd "$root" && cargo build --release -p bitnet-cli)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# convert_and_quantize HF_DIR: bitnet.cpp's converter (--outtype f32) then its llama-quantize
# to I2_S, as its setup_env.py runs them; leaves $tmp/f32.gguf and $tmp/i2_s.gguf.
convert_and_quantize() {
  PYTHONPATH=$src/3rdparty/llama.cpp/gguf-py:$src/utils "$venv/bin/python" \
    "$src/utils/convert-hf-to-gguf-bitnet.py" "$1" --outtype f32 --outfile "$tmp/f32.gguf" \
    >"$tmp/convert.log" 2>&1 || { tail -20 "$tmp/convert.log"; exit 1; }
  "$src/build-avx2/bin/llama-quantize" "$tmp/f32.gguf" "$tmp/i2_s.gguf" I2_S 1 \
    >"$tmp/quantize.log" 2>&1 || { tail -20 "$tmp/quantize.log"; exit 1; }
}
