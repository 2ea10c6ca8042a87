# Sourced by llama-tiny.sh and ../../trained/make-refs.sh: bitnet.cpp 404980e with its llama.cpp
# fork (the release the goldens came from), laid out by ../../shared/tools/build_refs.sh under
# $REF/bitnet.cpp and built again as bitnet.cpp's setup_env.py builds it (clang,
# BITNET_X86_TL2=ON) for x86 AVX2 + FMA + F16C only (GGML_NATIVE off), as shared libraries, with
# dump_logits.cpp linked against it. The compiler matters: gcc contracts `x * s + 0x1.8p23` in the
# activation quantizer's rounding into one FMA, which rounds some ties differently (clang does
# not contract across statements).
#
# Needs $REF, $MIRROR and $root; sets $src (the tree), $b (the build: $b/bin/llama-quantize,
# $b/bin/llama-cli, $b/dump_logits) and $ll (the fork inside the tree).
tools=${TOOLS:-$root/../shared/tools}
REF=$REF MIRROR=$MIRROR "$tools/build_refs.sh" bitnet
src=$REF/bitnet.cpp
b=$src/build-avx2
ll=$src/3rdparty/llama.cpp
command -v clang++ >/dev/null || { apt-get update -qq && apt-get install -y -qq clang >/dev/null; }
if [[ ! -f $b/CMakeCache.txt ]]; then
  cmake -S "$src" -B "$b" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DGGML_NATIVE=OFF -DGGML_AVX=ON \
    -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DBITNET_X86_TL2=ON \
    -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=ON >"$b.configure.log" 2>&1
fi
cmake --build "$b" -j "${JOBS:-2}" --target llama llama-quantize llama-cli >"$b.log" 2>&1
libs=$(dirname "$(find "$b" -name 'libllama.so' | head -1)")
gglibs=$(dirname "$(find "$b" -name 'libggml.so' | head -1)")
clang++ -O2 -std=c++17 "$root/testdata/golden/make/dump_logits.cpp" -I"$ll/include" \
  -I"$ll/ggml/include" -L"$libs" -L"$gglibs" -lllama -lggml -Wl,-rpath,"$libs:$gglibs" \
  -o "$b/dump_logits"
