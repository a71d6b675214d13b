#!/bin/bash
# run-device.sh - the one script the GPU machine runs for issue 15, in under
# 8 minutes on 16 cores: every step has a timeout cut to what is left of the
# budget, a failed step is recorded and the next one runs.  Writes
# $OUT/report.md (each step's status and time, the benchmark's tables) and
# $OUT/run.log (every step's output).
#
# Prepare here (a CUDA build; the GPU image lacks this project's libraries):
#   meson setup build-gpu -Dwerror=true -Dbuildtype=debugoptimized && ninja -C build-gpu
#   tests/gpu/prepare-device.sh build-gpu          # -> gpu-carry/ (ignored)
# then, with the device tool:  run(command: "bash tests/gpu/run-device.sh",
#   carry: ["gpu-carry"], timeout_s: 540)
#
# Steps: the machine; nvcc -Werror build of engine/cuda/ for sm_90 + PTX
# there (the toolchain check; the binaries that run are the carried ones);
# the op tests (every CUDA op vs the CPU backend); the cuda_ipc transfer
# backend between two processes (a push, the notification after it); kvrail run cuda vs cpu vs
# the NumPy reference on seven test models; device: cuda:N at start (node
# refusal, kvrail run, cuda:99); the benchmark on a 1B-shaped bf16 model.
# the 1P+1D cluster on the GPU (decode pool in HBM, KV over cuda_ipc).
set -u
BUDGET=${KVR_GPU_BUDGET_S:-470}
T0=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${KVR_GPU_BIN:-$ROOT/gpu-carry}
OUT=${OUT:-/tmp/kvr-gpu-out}
mkdir -p "$OUT"
REPORT=$OUT/report.md
LOG=$OUT/run.log
WD=$(mktemp -d /tmp/kvr-gpu.XXXXXX)
trap 'rm -rf "$WD"' EXIT
export LD_LIBRARY_PATH=$BIN/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 TMPDIR=$WD PATH=/usr/local/cuda/bin:$PATH
export ROOT BIN WD
PY=$(command -v python3)
: >"$LOG"
{
    echo "# issue 15: GPU run of $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    echo "| step | status | seconds |"
    echo "|---|---|---|"
} >"$REPORT"
declare -a TAIL=()

# step NAME WANT_SECONDS CMD...: runs CMD with a timeout of WANT_SECONDS cut
# to the budget left; status ok / skip (77) / FAIL rc / TIMEOUT
step() {
    local name=$1 want=$2
    shift 2
    local left=$((BUDGET - ($(date +%s) - T0)))
    local t=$((want < left ? want : left))
    if [ "$t" -lt 5 ]; then
        echo "| $name | not run: budget spent | 0 |" >>"$REPORT"
        return
    fi
    echo "===== $name (timeout ${t}s): $*" >>"$LOG"
    local s=$(date +%s)
    timeout -k 5 "$t" bash -c '"$@"' step "$@" >>"$LOG" 2>&1
    local rc=$? st
    case $rc in
    0) st=ok ;;
    77) st="skip (77)" ;;
    124 | 137) st="**TIMEOUT** (${t}s)" ;;
    *) st="**FAIL** rc $rc" ;;
    esac
    echo "===== $name: $st" >>"$LOG"
    echo "| $name | $st | $(($(date +%s) - s)) |" >>"$REPORT"
    [ $rc -eq 0 ] || TAIL+=("$name")
}

machine() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || return 1
    nvcc --version | tail -2
    nproc
    ls "$BIN/bin"
}

nvcc_build() {
    local inc="-I$BIN/include -I$ROOT/common -I$ROOT/engine -I$ROOT/engine/cuda -I$ROOT/transport -I$ROOT/transport/cuda"
    local f
    for f in "$ROOT"/engine/cuda/*.cu; do
        nvcc -std=c++17 -O3 -gencode 'arch=compute_90,code=[sm_90,compute_90]' $inc -D_GNU_SOURCE \
            -Werror all-warnings -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-Wno-missing-field-initializers,-Werror \
            -c "$f" -o "$WD/$(basename "$f" .cu).o" &
    done
    local bad=0
    for j in $(jobs -p); do wait "$j" || bad=1; done
    [ $bad -eq 0 ] || return 1
    if command -v cuobjdump >/dev/null; then
        cuobjdump --list-elf "$WD/cuda_kernels.o" && cuobjdump --list-ptx "$WD/cuda_kernels.o"
    fi
}

bench() {
    set -o pipefail
    "$BIN/bin/kvrail-mkmodel" --out "$WD/m1b" --layers 16 --hidden 2048 --heads 32 --kv-heads 8 \
        --head-dim 64 --intermediate 8192 --vocab 128256 --max-pos 8192 --dtype bf16 || return 1
    "$BIN/bin/bench_gpu" --model "$WD/m1b" | tee "$WD/bench.md"
}

export -f machine nvcc_build bench
# most telling first: a step the budget cuts is the last
step machine 15 machine
step backend_ops 60 "$BIN/bin/test_backend_ops"
step cuda_ipc_push 30 "$BIN/bin/test_cuda_ipc"
step staging_ring 15 "$BIN/bin/test_cuda_stage"
step nccl_pair 15 "$BIN/bin/test_nccl"
step kvrail_run_vs_cpu_vs_numpy 90 "$PY" "$ROOT/tests/gpu/gpu_run_ref_test.py" "$BIN/bin/kvrail" "$BIN/bin/kvrail-mkmodel"
step device_start 30 "$PY" "$ROOT/tests/gpu/device_refusal_test.py" --kvrail "$BIN/bin/kvrail" \
    --decode-bin "$BIN/bin/kvrail-decode" --mkmodel "$BIN/bin/kvrail-mkmodel" --cuda 1
step cluster_1p1d_hbm_ipc 70 "$PY" "$ROOT/tests/gpu/gpu_cluster_test.py" --router "$BIN/bin/kvrail-router" \
    --prefill-bin "$BIN/bin/kvrail-prefill" --decode-bin "$BIN/bin/kvrail-decode" --kvrail "$BIN/bin/kvrail" \
    --mkmodel "$BIN/bin/kvrail-mkmodel" --loadgen "$BIN/bin/kvrail-loadgen"
step benchmark 120 bench
step nvcc_sm90_werror 60 nvcc_build
{
    echo
    echo "total $(($(date +%s) - T0)) s of a $BUDGET s budget; failed or skipped: ${TAIL[*]:-none}"
    echo
    [ -s "$WD/bench.md" ] && cat "$WD/bench.md"
    echo
    echo "### the cuda_ipc transfer backend's push vs D2D (test_cuda_ipc)"
    echo
    sed -n '/^| [0-9]* MiB in/,/^| cuda_ipc push/p' "$LOG"
    echo
    echo "## failing lines"
    echo
    echo '```'
    grep -E "FAIL|TIMEOUT|error|Error" "$LOG" | head -60
    echo '```'
} >>"$REPORT"
cat "$REPORT"
