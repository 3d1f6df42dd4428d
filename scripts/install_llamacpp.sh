#!/usr/bin/env bash
# Build llama-cpp-python from source for the benchmark's llama.cpp systems.
# GGML_NATIVE=OFF with AMX off: llama.cpp's AMX path segfaults on batched prompts in our VMs.
# The AVX-512 family is switched on only where /proc/cpuinfo lists it.
set -euo pipefail
PIP="${PIP:-python3 -m pip}"
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }
args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
args+=" -DGGML_AVX=$(onoff avx) -DGGML_AVX2=$(onoff avx2) -DGGML_FMA=$(onoff fma) -DGGML_F16C=$(onoff f16c)"
if has avx512f; then
  args+=" -DGGML_AVX512=ON -DGGML_AVX512_VBMI=$(onoff avx512vbmi)"
  args+=" -DGGML_AVX512_VNNI=$(onoff avx512_vnni) -DGGML_AVX512_BF16=$(onoff avx512_bf16)"
fi
echo "CMAKE_ARGS=$args"
export CMAKE_ARGS="$args" FORCE_CMAKE=1
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
# pip builds in its own temp dir, outside the repo; --no-binary forces the source build.
# diskcache is named too: `import llama_cpp` imports it (llama_cpp/llama_cache.py) even though the bench
# never uses a cache, so a binding installed without its dependencies (--no-deps, or a wheel copied
# in) fails at import; naming it also lets pip take it as a wheel from the local index first.
$PIP install diskcache
$PIP install --no-binary llama-cpp-python "llama-cpp-python${LLAMACPP_VERSION:+==$LLAMACPP_VERSION}" "$@"
${PYTHON:-python3} -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__, 'imports')"
