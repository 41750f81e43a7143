#!/usr/bin/env bash
# Build a pinned llama.cpp (CPU only) for side-by-side benchmarks and interop
# checks against coil.
#
# The llama.cpp source comes from the llama-cpp-python sdist on PyPI, which
# vendors a full llama.cpp tree (including convert_hf_to_gguf.py and gguf-py).
#
# Usage:
#   scripts/build-llamacpp.sh [-jN] [--isa avx512|avx2|native]
#   LLAMACPP_DIR=/some/where nice -n 19 scripts/build-llamacpp.sh -j2
#
# Options:
#   --isa LEVEL      the x86 instruction set llama.cpp is built for (also
#                    LLAMACPP_ISA; default: avx512 where this CPU has
#                    AVX-512 F/VNNI/BF16, else avx2 -- an avx512 build dies
#                    of SIGILL on an AVX2-only CPU such as AMD EPYC before
#                    Zen 4):
#                      avx512  AVX-512 F/VNNI/BF16 on, AMX off
#                      avx2    AVX2 + FMA + F16C + BMI2, every AVX-512 / AMX /
#                              AVX-VNNI option off: the level of most desktop,
#                              laptop and pre-Zen-4 AMD CPUs; runs on any
#                              AVX-512 machine too, so it measures the AVX2
#                              comparison there (coil: COIL_SIMD=avx2)
#                      native  GGML_NATIVE=ON (whatever this CPU has; AMX is
#                              still forced off)
#                    The build directory records its level
#                    ($LLAMACPP_DIR/build/coil-isa; trees from before this
#                    option count as avx512). Without --isa an existing build
#                    is reused whatever its level; with --isa a build of
#                    another level in the same LLAMACPP_DIR is refused: use
#                    another directory.
#
# Environment:
#   LLAMACPP_DIR     output directory (default: <repo>/../llama.cpp-build).
#                    Must be outside the repository.
#                      $LLAMACPP_DIR/src/      unpacked sdist
#                      $LLAMACPP_DIR/build/    cmake build tree
#                      $LLAMACPP_DIR/build/bin llama-bench, llama-quantize, ...
#                      $LLAMACPP_DIR/env.sh    exports paths (source it)
#   JOBS             parallel compile jobs (default: nproc; -jN overrides)
#   LLAMACPP_SDIST   path to an already downloaded
#                    llama_cpp_python-<ver>.tar.gz; skips the PyPI download
#   LLAMACPP_WITH_SERVER=0
#                    skip llama-server and llama-cli (default 1: build them;
#                    they pull in the server, mtmd and cpp-httplib, ~3 extra
#                    minutes on 2 cores on top of ~6 for the rest)
#   PYTHON           python interpreter used for pip (default: python3)
#
# Idempotent: when the binaries already exist nothing is rebuilt.
#
# Notes on flags: GGML_NATIVE is OFF (except --isa native) and the ISA is
# spelled out (AVX2/FMA/F16C are on by default once NATIVE is off; avx512 adds
# AVX-512 F/VNNI/BF16, avx2 turns every AVX-512 and AVX-VNNI option off).  AMX
# must stay OFF: a native build enables AMX, and its binaries died of SIGILL on the
# 2-vCPU VMs the benchmarks ran on (their CPUs list AMX).
# LLAMA_CURL is deprecated in this llama.cpp version (no-op), so it is not
# passed; LLAMA_OPENSSL / prebuilt UI download are turned off instead so the
# build needs no network and no libssl.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
WITH_SERVER="${LLAMACPP_WITH_SERVER:-1}"
ISA="${LLAMACPP_ISA:-}"

while [ $# -gt 0 ]; do
    case "$1" in
        -j)   JOBS="$2"; shift 2 ;;
        -j*)  JOBS="${1#-j}"; shift ;;
        --isa) ISA="${2:-}"; shift 2 ;;
        --isa=*) ISA="${1#--isa=}"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d'; exit 0 ;;
        *)    echo "error: unknown argument: $1" >&2; exit 2 ;;
    esac
done

case "$ISA" in
    ""|avx512|avx2|native) ;;
    *) echo "error: --isa must be avx512, avx2 or native (got '$ISA')" >&2; exit 2 ;;
esac

LLAMACPP_DIR="${LLAMACPP_DIR:-$REPO_ROOT/../llama.cpp-build}"
LLAMACPP_DIR="$(realpath -m "$LLAMACPP_DIR")"
case "$LLAMACPP_DIR/" in
    "$REPO_ROOT"/*)
        echo "error: LLAMACPP_DIR ($LLAMACPP_DIR) is inside the repository; put it outside" >&2
        exit 1
        ;;
esac
mkdir -p "$LLAMACPP_DIR"

SRC_PARENT="$LLAMACPP_DIR/src"
PKG_DIR="$SRC_PARENT/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
LLAMA_SRC="$PKG_DIR/vendor/llama.cpp"
BUILD_DIR="$LLAMACPP_DIR/build"
BIN_DIR="$BUILD_DIR/bin"
ISA_FILE="$BUILD_DIR/coil-isa"

# Required binaries, plus "run a prompt" tools of which at least one must
# exist: llama-completion (classic llama-cli behaviour) and llama-simple.
# llama-cli in this version is built on top of the server, so it is skipped
# together with it under LLAMACPP_WITH_SERVER=0.
REQUIRED=(llama-bench llama-quantize llama-perplexity)
RUNNERS=(llama-completion llama-simple)
if [ "$WITH_SERVER" = "1" ]; then
    REQUIRED+=(llama-server)
    RUNNERS+=(llama-cli)
fi
# Tools the reference checks use (an importance matrix; splitting a model as
# llama.cpp does): built when this llama.cpp has them.
TOOLS=(llama-imatrix llama-gguf-split)
TARGETS=("${REQUIRED[@]}" "${RUNNERS[@]}" "${TOOLS[@]}")

log() { echo "[build-llamacpp] $*" >&2; }

print_summary() {
    local convert="$LLAMA_SRC/convert_hf_to_gguf.py"
    local gguf_py="$LLAMA_SRC/gguf-py"
    cat > "$LLAMACPP_DIR/env.sh" <<EOF
# generated by scripts/build-llamacpp.sh; source this file
export LLAMACPP_DIR="$LLAMACPP_DIR"
export LLAMACPP_BIN="$BIN_DIR"
export LLAMACPP_SRC="$LLAMA_SRC"
export LLAMACPP_CONVERT="$convert"
export LLAMACPP_GGUF_PY="$gguf_py"
export LLAMACPP_ISA="$ISA"
EOF
    echo "llama.cpp (from llama-cpp-python $LLAMA_CPP_PYTHON_VERSION), built for $ISA"
    echo "  binaries:"
    local t
    for t in "${TARGETS[@]}"; do
        if [ -x "$BIN_DIR/$t" ]; then
            echo "    $BIN_DIR/$t"
        fi
    done
    echo "  convert_hf_to_gguf.py: $convert"
    echo "  gguf-py:               $gguf_py"
    echo "  converter usage:"
    echo "    PYTHONPATH=$gguf_py $PYTHON $convert <hf-model-dir> --outtype f16 --outfile out.gguf"
    echo "    (needs numpy, torch, transformers, sentencepiece, ...: see $LLAMA_SRC/requirements/)"
    echo "  env file: source $LLAMACPP_DIR/env.sh"
}

all_built() {
    local t runner=0
    for t in "${REQUIRED[@]}"; do
        [ -x "$BIN_DIR/$t" ] || return 1
    done
    for t in "${RUNNERS[@]}"; do
        [ -x "$BIN_DIR/$t" ] && runner=1
    done
    [ "$runner" = 1 ] || return 1
    [ -f "$LLAMA_SRC/convert_hf_to_gguf.py" ] || return 1
}

# Whether this CPU runs the avx512 level (F, VNNI and BF16): the default
# level, and whether an avx512 tree may be reused here.
cpu_has_avx512() {
    local flags
    flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
    for f in avx512f avx512_vnni avx512_bf16; do
        case " $flags " in *" $f "*) ;; *) return 1 ;; esac
    done
}
# A build tree of another level is never silently reused (the binaries would
# run, measuring the wrong ISA). Trees from before --isa existed are avx512.
if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
    built_isa="$(cat "$ISA_FILE" 2>/dev/null || echo avx512)"
    ISA="${ISA:-$built_isa}"
    if [ "$built_isa" != "$ISA" ]; then
        echo "error: $BUILD_DIR was built for $built_isa, not $ISA; set LLAMACPP_DIR to another directory" >&2
        exit 1
    fi
    if [ "$built_isa" = avx512 ] && ! cpu_has_avx512; then
        echo "error: $BUILD_DIR was built for avx512, which this CPU lacks (its binaries die of SIGILL); set LLAMACPP_DIR to another directory (the default level there is avx2)" >&2
        exit 1
    fi
fi

if [ -z "$ISA" ]; then
    if cpu_has_avx512; then ISA=avx512; else ISA=avx2; fi
fi

if all_built; then
    log "all binaries present in $BIN_DIR; nothing to do"
    print_summary
    exit 0
fi

# ---- 1. source ---------------------------------------------------------------
if [ ! -f "$LLAMA_SRC/CMakeLists.txt" ]; then
    mkdir -p "$SRC_PARENT"
    sdist="${LLAMACPP_SDIST:-}"
    if [ -z "$sdist" ]; then
        dl_dir="$LLAMACPP_DIR/dl"
        mkdir -p "$dl_dir"
        sdist="$dl_dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
        if [ ! -f "$sdist" ]; then
            log "installing build helpers (scikit-build-core, cmake, ninja)"
            "$PYTHON" -m pip install -q scikit-build-core cmake ninja
            log "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION sdist from PyPI"
            "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-python \
                --no-build-isolation "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$dl_dir"
        fi
        if [ ! -f "$sdist" ]; then
            sdist="$(ls "$dl_dir"/llama_cpp_python-"$LLAMA_CPP_PYTHON_VERSION".tar.gz 2>/dev/null | head -n1 || true)"
            [ -n "$sdist" ] || { echo "error: sdist not found in $dl_dir" >&2; exit 1; }
        fi
    fi
    log "unpacking $sdist"
    rm -rf "$PKG_DIR"
    tar -xzf "$sdist" -C "$SRC_PARENT"
    [ -f "$LLAMA_SRC/CMakeLists.txt" ] || { echo "error: $LLAMA_SRC/CMakeLists.txt missing after unpack" >&2; exit 1; }
fi

# ---- 2. configure ------------------------------------------------------------
if ! command -v cmake >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q cmake ninja
fi
GENERATOR=()
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
    GENERATOR=(-G Ninja)
fi

case "$ISA" in
    avx512) ISA_FLAGS=(
        -DGGML_NATIVE=OFF
        -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    ) ;;
    avx2) ISA_FLAGS=(
        -DGGML_NATIVE=OFF
        -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
        -DGGML_AVX_VNNI=OFF
        -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    ) ;;
    native) ISA_FLAGS=(
        -DGGML_NATIVE=ON
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
    ) ;;
esac

CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    "${ISA_FLAGS[@]}"
    -DGGML_OPENMP=ON
    -DGGML_CCACHE=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=ON
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER="$([ "$WITH_SERVER" = "1" ] && echo ON || echo OFF)"
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
)

log "configuring $LLAMA_SRC -> $BUILD_DIR"
cmake -S "$LLAMA_SRC" -B "$BUILD_DIR" "${GENERATOR[@]}" "${CMAKE_FLAGS[@]}"

# Safety net: AMX must never be enabled (SIGILL on this hardware); NATIVE
# only when asked for; AVX-512 never in an avx2 build.
forbidden='^GGML_(AMX_TILE|AMX_INT8|AMX_BF16|NATIVE):BOOL=ON'
[ "$ISA" = native ] && forbidden='^GGML_(AMX_TILE|AMX_INT8|AMX_BF16):BOOL=ON'
[ "$ISA" = avx2 ] && forbidden='^GGML_(AMX_TILE|AMX_INT8|AMX_BF16|NATIVE|AVX512[A-Z0-9_]*|AVX_VNNI):BOOL=ON'
if grep -E "$forbidden" "$BUILD_DIR/CMakeCache.txt"; then
    echo "error: an option outside --isa $ISA got enabled in $BUILD_DIR/CMakeCache.txt" >&2
    exit 1
fi
echo "$ISA" > "$ISA_FILE"

# ---- 3. build only the targets we need ----------------------------------------
available="$(cmake --build "$BUILD_DIR" --target help 2>/dev/null || true)"
BUILD_TARGETS=()
for t in "${TARGETS[@]}"; do
    if grep -qE "(^|[[:space:]])$t(:|[[:space:]]|$)" <<<"$available"; then
        BUILD_TARGETS+=("$t")
    else
        log "warning: target $t does not exist in this llama.cpp; skipping"
    fi
done
for t in "${REQUIRED[@]}"; do
    case " ${BUILD_TARGETS[*]} " in
        *" $t "*) ;;
        *) echo "error: required target $t missing from this llama.cpp" >&2; exit 1 ;;
    esac
done

log "building ${BUILD_TARGETS[*]} with -j$JOBS"
start=$(date +%s)
cmake --build "$BUILD_DIR" --config Release -j "$JOBS" --target "${BUILD_TARGETS[@]}"
log "build took $(( $(date +%s) - start ))s"

all_built || { echo "error: build finished but binaries are missing in $BIN_DIR" >&2; exit 1; }
print_summary
