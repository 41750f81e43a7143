#!/usr/bin/env bash
# coil vs llama.cpp, end to end, on the same GGUF files, same threads,
# interleaved.
#
# 1. builds llama.cpp once (scripts/build-llamacpp.sh; idempotent);
# 2. makes a Python environment for llama.cpp's converter (transformers 4.x),
#    and, when a Qwen3.5 shape is asked for, a second one with transformers 5
#    (which has Qwen3.5; each only when a model needs it);
# 3. creates the random-weight benchmark models (tools/make_bench_models.py:
#    mamba2-370m-like, hybrid-350m-like by default; see docs/PERFORMANCE.md,
#    "How to measure");
# 4. converts them with llama.cpp's convert_hf_to_gguf.py (--outtype f16, and
#    --outtype bf16 for BF16) and quantizes to Q8_0 and Q4_K_M with
#    llama-quantize. The Qwen3.5 shapes and kimi-linear-48b-a3b-like are made
#    and converted under transformers 5, the converter run with its BPE
#    pre-tokenizer name fixed to "olmo" (the name it gives the GPT-NeoX
#    tokenizer) and, for Qwen3.5, --no-mtp, as tools/make_fixtures_qwen35.py
#    runs it;
#    --prepare-only stops here (no coil build, no benchmark, no GNU time
#    needed) and lists the files;
# 5. builds coil in release;
# 6. for each file, REPS rounds of: `coil bench`, then `llama-bench` (once per
#    --repack value), each a fresh process with one timed repetition after
#    its own warm-up, under /usr/bin/time -v for the peak RSS;
# 7. prints, per file, pp and tg tokens/s (mean ± std over rounds) of both,
#    the ratio coil / llama.cpp (llama.cpp: the best of its --repack
#    settings per column) and the peak RSS of each
#    (llama.cpp: of its default, --repack 1).
#
# -d DEPTH runs both tests on DEPTH tokens of context (llama-bench -d and
# coil bench -d: the context is processed once per process, untimed).
#
# --isa LEVEL compares both engines at one x86 SIMD level: llama.cpp built
# for LEVEL (scripts/build-llamacpp.sh --isa LEVEL, in LLAMACPP_DIR) and coil
# run with COIL_SIMD=LEVEL (avx2: and COIL_AVX_VNNI=0; native: coil's best level). So `--isa avx2` on an
# AVX-512 machine measures what an AVX2-only CPU gets; give it its own
# LLAMACPP_DIR there (the default directory holds the AVX-512 build). Without
# --isa: whatever llama.cpp build LLAMACPP_DIR holds and coil's best level.
# The report names the CPU and both levels.
#
# Everything it creates lives outside the repository.
#
# Usage:
#   scripts/bench-vs-llamacpp.sh [-r REPS] [-t THREADS] [-p N_PROMPT] [-n N_GEN] [-d DEPTH]
#                                [--models "mamba2-370m-like hybrid-350m-like"]
#                                (also: mamba-370m-like, a Mamba-1 shape;
#                                lfm2-1.2b-like, LFM2's short-conv hybrid;
#                                qwen35-0.8b-like and qwen35moe-1b-like, the
#                                Gated DeltaNet hybrids, dense and MoE;
#                                kimi-linear-48b-a3b-like, KDA + MLA + MoE)
#                                [--types "F16 BF16 Q8_0 Q4_K_M"] [--skip-build]
#                                (any llama-quantize type too: Q2_K, Q3_K_M,
#                                Q5_K_M, IQ4_XS, ...)
#                                [--isa avx2|avx512|native] [--prepare-only]
#   scripts/bench-vs-llamacpp.sh --report RUN_DIR [same -r/-p/-n/-d/--models/--types]
#                                (re-print the report of a finished run)
#
# Environment:
#   BENCH_DIR        models, logs and results (default: <repo>/../bench-models)
#   TOKENIZER        the GPT-NeoX-20B tokenizer.json (default:
#                    <repo>/../shared/data/tokenizers/gpt-neox-20b_tokenizer.json)
#   CONVERT_PYTHON   a Python with transformers 4.x, torch, safetensors,
#                    numpy, sentencepiece for the converter (default: a venv
#                    made in $BENCH_DIR/venv-convert, sharing the system's
#                    packages, with transformers 4.57 pinned); not made when
#                    only transformers 5 shapes are asked for
#   QWEN35_PYTHON    a Python with transformers 5.x (Qwen3.5, KimiLinear),
#                    torch, safetensors, numpy, sentencepiece that creates and
#                    converts the Qwen3.5 and Kimi-Linear shapes (default:
#                    a venv made in $BENCH_DIR/venv-qwen35, sharing the
#                    system's packages, with transformers 5.23 pinned)
#   LLAMACPP_DIR     where scripts/build-llamacpp.sh builds llama.cpp
#   LLAMA_REPACK     llama-bench --repack values to try (default "1 0")
#   COIL_BENCH_ARGS  extra arguments for `coil bench`
#   LLAMA_BENCH_ARGS extra arguments for `llama-bench` (e.g. "--poll 0")
#   CARGO_TARGET_DIR honoured when locating the coil binary
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
REPS=3
THREADS="$(nproc 2>/dev/null || echo 2)"
N_PROMPT=512
N_GEN=128
N_DEPTH=0
MODELS="mamba2-370m-like hybrid-350m-like"
TYPES="F16 BF16 Q8_0 Q4_K_M"
SKIP_BUILD=0
REPORT_ONLY=""
ISA=""
PREPARE_ONLY=0
# What tools/make_bench_models.py can build.
KNOWN_MODELS="mamba2-370m-like hybrid-350m-like mamba-370m-like lfm2-1.2b-like qwen35-0.8b-like qwen35moe-1b-like kimi-linear-48b-a3b-like"

while [ $# -gt 0 ]; do
    case "$1" in
        -r) REPS="$2"; shift 2 ;;
        -t) THREADS="$2"; shift 2 ;;
        -p) N_PROMPT="$2"; shift 2 ;;
        -n) N_GEN="$2"; shift 2 ;;
        -d) N_DEPTH="$2"; shift 2 ;;
        --models) MODELS="$2"; shift 2 ;;
        --types) TYPES="$2"; shift 2 ;;
        --skip-build) SKIP_BUILD=1; shift ;;
        --prepare-only) PREPARE_ONLY=1; shift ;;
        --isa) ISA="$2"; shift 2 ;;
        --report) REPORT_ONLY="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d'; exit 0 ;;
        *) echo "error: unknown argument: $1" >&2; exit 2 ;;
    esac
done

for m in $MODELS; do
    case " $KNOWN_MODELS " in
        *" $m "*) ;;
        *) echo "error: unknown model '$m' (known: $KNOWN_MODELS)" >&2; exit 2 ;;
    esac
done

case "$ISA" in
    ""|avx2|avx512|native) ;;
    *) echo "error: --isa must be avx2, avx512 or native (got '$ISA')" >&2; exit 2 ;;
esac
# coil's side of --isa: a cap on its kernels (an unsupported level makes
# coil exit with a clear error before anything runs).
case "$ISA" in
    avx2|avx512) export COIL_SIMD="$ISA" ;;
    native) unset COIL_SIMD ;;
esac
# The avx2 build of llama.cpp has AVX-VNNI off (the level of AMD before Zen 4
# and most laptops), so coil leaves it off there too.
if [ "$ISA" = avx2 ]; then export COIL_AVX_VNNI=0; fi

BENCH_DIR="$(realpath -m "${BENCH_DIR:-$REPO_ROOT/../bench-models}")"
case "$BENCH_DIR/" in
    "$REPO_ROOT"/*) echo "error: BENCH_DIR ($BENCH_DIR) is inside the repository; put it outside" >&2; exit 1 ;;
esac
TOKENIZER="${TOKENIZER:-$REPO_ROOT/../shared/data/tokenizers/gpt-neox-20b_tokenizer.json}"
LLAMA_REPACK="${LLAMA_REPACK:-1 0}"
mkdir -p "$BENCH_DIR"
log() { echo "[bench-vs-llamacpp] $*" >&2; }

report() {
"${PYTHON:-python3}" - "$1" "$MODELS" "$TYPES" "$REPS" "$LLAMA_REPACK" "$N_PROMPT" "$N_GEN" "$N_DEPTH" <<'EOF'
import json, statistics, sys
from pathlib import Path

run, models, types, reps, repacks, n_p, n_g, n_d = sys.argv[1:9]
at = f" @ d{n_d}" if int(n_d) > 0 else ""
run = Path(run)
models, types, repacks = models.split(), types.split(), repacks.split()
reps = int(reps)

def rss_mib(path):
    for line in path.read_text().splitlines():
        if "Maximum resident set size" in line:
            return int(line.split(":")[1]) / 1024
    return float("nan")

def ms(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)

def pair(r):
    return f"{statistics.median(r):.2f} [{r[0]:.2f}–{r[-1]:.2f}]" if r else "-"

def fmt(m, s):
    return f"{m:.1f} ± {s:.1f}"

rows = []
summary = []
for m in models:
    for t in types:
        c_pp, c_tg, c_rss = [], [], []
        l_pp = {r: [] for r in repacks}
        l_tg = {r: [] for r in repacks}
        l_rss = {r: [] for r in repacks}
        for i in range(1, reps + 1):
            tag = f"{m}.{t}.{i}"
            c = json.loads((run / f"{tag}.coil.json").read_text())
            c_pp.append(c["pp_tps"]); c_tg.append(c["tg_tps"])
            c_rss.append(rss_mib(run / f"{tag}.coil.time"))
            for r in repacks:
                for e in json.loads((run / f"{tag}.llama-repack{r}.json").read_text()):
                    (l_pp if e["n_prompt"] > 0 else l_tg)[r].append(e["avg_ts"])
                l_rss[r].append(rss_mib(run / f"{tag}.llama-repack{r}.time"))
        cpp, ctg = ms(c_pp), ms(c_tg)
        best_pp = max(repacks, key=lambda r: ms(l_pp[r])[0])
        best_tg = max(repacks, key=lambda r: ms(l_tg[r])[0])
        lpp, ltg = ms(l_pp[best_pp]), ms(l_tg[best_tg])
        # Paired: each round's coil figure over the same round's llama.cpp one.
        pair_pp = sorted(c / l for c, l in zip(c_pp, l_pp[best_pp]))
        pair_tg = sorted(c / l for c, l in zip(c_tg, l_tg[best_tg]))
        rss_c = max(c_rss)
        rss_l = max(l_rss[repacks[0]])
        rows.append(
            f"| {m} | {t} | {fmt(*cpp)} | {fmt(*lpp)} (rp{best_pp}) | **{cpp[0] / lpp[0]:.2f}** "
            f"| {fmt(*ctg)} | {fmt(*ltg)} (rp{best_tg}) | **{ctg[0] / ltg[0]:.2f}** "
            f"| {pair(pair_pp)} | {pair(pair_tg)} "
            f"| {rss_c:.0f} | {rss_l:.0f} | {rss_c / rss_l:.2f} |"
        )
        summary.append(dict(model=m, type=t, coil_pp=cpp, llama_pp=lpp, llama_pp_repack=best_pp,
                            coil_tg=ctg, llama_tg=ltg, llama_tg_repack=best_tg,
                            pp_paired=pair_pp, tg_paired=pair_tg, coil_rss_mib=rss_c, llama_rss_mib=rss_l,
                            llama_rss_mib_by_repack={r: max(l_rss[r]) for r in repacks},
                            llama_by_repack={r: dict(pp=ms(l_pp[r]), tg=ms(l_tg[r])) for r in repacks}))

coil_runs = [json.loads(p.read_text()) for p in sorted(run.glob("*.coil.json"))]
infos = sorted({c.get("system_info", "(not reported)") for c in coil_runs})
print((run / "info.txt").read_text().rstrip())
for info in infos:
    print(f"coil system info: {info}")
print()
print(f"| model | type | coil pp{n_p}{at} t/s | llama.cpp pp{n_p}{at} t/s | pp ratio | coil tg{n_g}{at} t/s "
      f"| llama.cpp tg{n_g}{at} t/s | tg ratio | pp paired ratio | tg paired ratio | coil peak RSS MiB | llama.cpp peak RSS MiB (rp{repacks[0]}) | RSS ratio |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
print("\n".join(rows))
print()
print("ratio = coil / llama.cpp (llama.cpp: the better --repack setting per column, rpN);"
      " t/s: mean ± std over rounds, each round a fresh process with one timed repetition;"
      " paired ratio: median [min–max] over rounds of coil / llama.cpp in the same round.")
(run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
EOF
}
if [ -n "$REPORT_ONLY" ]; then
    report "$REPORT_ONLY"
    exit 0
fi

if [ "$PREPARE_ONLY" = 0 ] && [ ! -x /usr/bin/time ]; then
    echo "error: /usr/bin/time (GNU time) is needed for peak RSS" >&2
    exit 1
fi

# ---- 1. llama.cpp --------------------------------------------------------------
if [ -n "$ISA" ]; then
    "$REPO_ROOT/scripts/build-llamacpp.sh" --isa "$ISA" >&2
else
    "$REPO_ROOT/scripts/build-llamacpp.sh" >&2
fi
LLAMACPP_DIR="$(realpath -m "${LLAMACPP_DIR:-$REPO_ROOT/../llama.cpp-build}")"
# shellcheck disable=SC1091
source "$LLAMACPP_DIR/env.sh"
# shellcheck disable=SC2153  # set by env.sh
: "${LLAMACPP_BIN:?not set by $LLAMACPP_DIR/env.sh}" "${LLAMACPP_CONVERT:?}" "${LLAMACPP_GGUF_PY:?}"

# ---- 2. converter environments --------------------------------------------------
# The Qwen3.5 and Kimi-Linear shapes need transformers 5 (for the model and
# config classes; the pinned converter runs under it too); every other shape
# is made and converted under transformers 4.57, the version the pinned
# converter expects.
is_tf5() { case "$1" in qwen35*|kimi-linear*) return 0 ;; *) return 1 ;; esac; }

need_convert_env=0
for m in $MODELS; do
    is_tf5 "$m" || need_convert_env=1
done
# A venv in $1 (sharing the system's packages) with transformers $2.* pinned
# and torch; says why ($3) when it is made. Prints its python.
make_venv() {
    local venv="$1" ver="$2"
    if [ ! -x "$venv/bin/python" ]; then
        log "making $venv ($3)"
        python3 -m venv --system-site-packages "$venv"
    fi
    if ! "$venv/bin/python" -c "import transformers, sys; sys.exit(0 if transformers.__version__.startswith('$ver') else 1)" 2>/dev/null; then
        "$venv/bin/pip" install -q "transformers==$ver.*" sentencepiece safetensors numpy >&2
    fi
    if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
        "$venv/bin/pip" install -q torch >&2
    fi
    echo "$venv/bin/python"
}

if [ "$need_convert_env" = 1 ] && [ -z "${CONVERT_PYTHON:-}" ]; then
    CONVERT_PYTHON="$(make_venv "$BENCH_DIR/venv-convert" 4.57 "transformers 4.57 for llama.cpp's converter")"
fi

# Made on first use only (a model, F16 or BF16 file of a transformers 5 shape missing).
qwen35_python() {
    [ -n "${QWEN35_PYTHON:-}" ] && return 0
    QWEN35_PYTHON="$(make_venv "$BENCH_DIR/venv-qwen35" 5.23 "transformers 5 for the Qwen3.5 and Kimi-Linear shapes")"
}

# llama.cpp's converter with its BPE pre-tokenizer name fixed to "olmo", the
# name its table gives the GPT-NeoX tokenizer, as tools/make_fixtures_qwen35.py
# runs it. The table is keyed by the hash of a check string's tokens; under
# transformers 5.23 the full NeoX tokenizer still hashes to olmo, so this only
# keeps a transformers 5 release that tokenizes differently from stopping the
# conversion. argv: the converter, then its arguments.
FIXED_PRE_CONVERT='
import os, sys
convert = sys.argv.pop(1)
sys.argv[0] = convert
sys.path.insert(0, os.path.dirname(convert))
import convert_hf_to_gguf
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "olmo"
convert_hf_to_gguf.main()
'

# convert_hf MODEL OUTTYPE OUTFILE LOGFILE
convert_hf() {
    local m="$1" outtype="$2" out="$3" logf="$4"
    local hf="$BENCH_DIR/$m/hf"
    log "converting $m (llama.cpp's convert_hf_to_gguf.py --outtype $outtype)"
    if is_tf5 "$m"; then
        # --no-mtp drops Qwen3.5's MTP block; the converter refuses it for
        # architectures without MTP export (Kimi-Linear).
        local mtp=()
        case "$m" in qwen35*) mtp=(--no-mtp) ;; esac
        PYTHONPATH="$LLAMACPP_GGUF_PY" "$QWEN35_PYTHON" -c "$FIXED_PRE_CONVERT" "$LLAMACPP_CONVERT" \
            "$hf" --outtype "$outtype" "${mtp[@]}" --outfile "$out.partial" > "$logf" 2>&1 \
            || { echo "error: conversion failed, see $logf" >&2; exit 1; }
    else
        PYTHONPATH="$LLAMACPP_GGUF_PY" "$CONVERT_PYTHON" "$LLAMACPP_CONVERT" "$hf" \
            --outtype "$outtype" --outfile "$out.partial" > "$logf" 2>&1 \
            || { echo "error: conversion failed, see $logf" >&2; exit 1; }
    fi
    mv "$out.partial" "$out"
}

# ---- 3-4. models -----------------------------------------------------------------
for m in $MODELS; do
    hf="$BENCH_DIR/$m/hf"
    f16="$BENCH_DIR/$m/$m.F16.gguf"
    bf16="$BENCH_DIR/$m/$m.BF16.gguf"
    py="${CONVERT_PYTHON:-}"
    if is_tf5 "$m"; then
        want_bf16=0
        case " $TYPES " in *" BF16 "*) want_bf16=1 ;; esac
        if [ ! -f "$hf/model.safetensors" ] || [ ! -f "$f16" ] || { [ "$want_bf16" = 1 ] && [ ! -f "$bf16" ]; }; then
            qwen35_python
        fi
        py="${QWEN35_PYTHON:-}"
    fi
    if [ ! -f "$hf/model.safetensors" ]; then
        [ -f "$TOKENIZER" ] || { echo "error: tokenizer $TOKENIZER not found (set TOKENIZER)" >&2; exit 1; }
        log "creating $m"
        "$py" "$REPO_ROOT/tools/make_bench_models.py" --tokenizer "$TOKENIZER" \
            --out "$BENCH_DIR" --only "$m" >&2
    fi
    if [ ! -f "$f16" ]; then
        convert_hf "$m" f16 "$f16" "$BENCH_DIR/$m/convert.log"
    fi
    for t in $TYPES; do
        [ "$t" = F16 ] && continue
        if [ "$t" = BF16 ]; then
            # bf16 is a conversion (the checkpoint's own type), not a quantization
            if [ ! -f "$bf16" ]; then
                convert_hf "$m" bf16 "$bf16" "$BENCH_DIR/$m/convert.bf16.log"
            fi
            continue
        fi
        q="$BENCH_DIR/$m/$m.$t.gguf"
        if [ ! -f "$q" ]; then
            log "quantizing $m to $t"
            "$LLAMACPP_BIN/llama-quantize" "$f16" "$q.partial" "$t" "$THREADS" \
                > "$BENCH_DIR/$m/quantize.$t.log" 2>&1 \
                || { echo "error: llama-quantize failed, see $BENCH_DIR/$m/quantize.$t.log" >&2; exit 1; }
            mv "$q.partial" "$q"
        fi
    done
done

if [ "$PREPARE_ONLY" = 1 ]; then
    log "models ready (--prepare-only: no coil build, no benchmark)"
    for m in $MODELS; do
        for t in $TYPES; do
            echo "$BENCH_DIR/$m/$m.$t.gguf"
        done
    done
    log "llama.cpp binaries: $LLAMACPP_BIN"
    exit 0
fi

# ---- 5. coil ---------------------------------------------------------------------
if [ "$SKIP_BUILD" = 0 ]; then
    log "building coil (release)"
    (cd "$REPO_ROOT" && cargo build --release -p coil-cli >&2)
fi
COIL="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/release/coil"
[ -x "$COIL" ] || { echo "error: $COIL not found" >&2; exit 1; }

# ---- 6. interleaved runs ---------------------------------------------------------
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
RUN_DIR="$BENCH_DIR/runs/$STAMP"
mkdir -p "$RUN_DIR"
{
    echo "date: $STAMP"
    echo "commit: $(git -C "$REPO_ROOT" rev-parse --short HEAD)$(git -C "$REPO_ROOT" diff --quiet HEAD -- crates || echo ' (+ uncommitted changes)')"
    echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -n1) (family $(lscpu | sed -n 's/^CPU family: *//p' | head -n1), model $(lscpu | sed -n 's/^Model: *//p' | head -n1)), $(nproc) CPUs, x86 flags: $(grep -m1 -o -w -E 'avx2|fma|f16c|bmi2|avx_vnni|avx512f|avx512_vnni|avx512_bf16|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "isa: llama.cpp built for ${LLAMACPP_ISA:-avx512} ($LLAMACPP_DIR); coil COIL_SIMD=${COIL_SIMD:-(unset: best level)}${COIL_AVX_VNNI:+ COIL_AVX_VNNI=$COIL_AVX_VNNI}"
    echo "threads: $THREADS, reps: $REPS, pp$N_PROMPT, tg$N_GEN, depth $N_DEPTH, llama-bench --repack: $LLAMA_REPACK ${LLAMA_BENCH_ARGS:-}"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$RUN_DIR/info.txt"
cat "$RUN_DIR/info.txt" >&2

rss_kb() { sed -n 's/.*Maximum resident set size (kbytes): *//p' "$1"; }

for m in $MODELS; do
    for t in $TYPES; do
        f="$BENCH_DIR/$m/$m.$t.gguf"
        [ -f "$f" ] || { echo "error: $f missing" >&2; exit 1; }
        for ((i = 1; i <= REPS; i++)); do
            tag="$m.$t.$i"
            echo "$tag $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RUN_DIR/load.txt"
            log "$m $t round $i/$REPS: coil"
            # shellcheck disable=SC2086
            /usr/bin/time -v -o "$RUN_DIR/$tag.coil.time" \
                "$COIL" bench -m "$f" -p "$N_PROMPT" -n "$N_GEN" -d "$N_DEPTH" -r 1 -t "$THREADS" --json \
                ${COIL_BENCH_ARGS:-} > "$RUN_DIR/$tag.coil.json" 2> "$RUN_DIR/$tag.coil.err" \
                || { echo "error: coil bench failed, see $RUN_DIR/$tag.coil.err" >&2; exit 1; }
            # shellcheck disable=SC2086
            for rp in $LLAMA_REPACK; do
                log "$m $t round $i/$REPS: llama-bench --repack $rp"
                /usr/bin/time -v -o "$RUN_DIR/$tag.llama-repack$rp.time" \
                    "$LLAMACPP_BIN/llama-bench" -m "$f" -p "$N_PROMPT" -n "$N_GEN" -d "$N_DEPTH" -r 1 \
                    -t "$THREADS" --repack "$rp" -o json ${LLAMA_BENCH_ARGS:-} \
                    > "$RUN_DIR/$tag.llama-repack$rp.json" 2> "$RUN_DIR/$tag.llama-repack$rp.err" \
                    || { echo "error: llama-bench failed, see $RUN_DIR/$tag.llama-repack$rp.err" >&2; exit 1; }
            done
        done
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$RUN_DIR/info.txt"

# ---- 7. report -------------------------------------------------------------------
report "$RUN_DIR" | tee "$RUN_DIR/report.md"
log "results in $RUN_DIR (report.md, summary.json, raw JSON and /usr/bin/time logs)"
