#!/bin/sh
# libfuzzer.sh - builds tests/fuzz's targets with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer (every report fatal) and
# runs each for RUNS inputs from its seed corpus, or for N seconds when
# RUNS is "Ns" (CI: a few seconds each; a long campaign: e.g. 600s).  The code
# under test (router modules, framing, protobuf decoders, JSON) is compiled
# here with clang so libFuzzer sees its coverage; the rest (tokenizer,
# sampler, common) is linked from the meson build.  New inputs found go to a
# scratch directory, not the committed corpus; a crash leaves its input in
# $OUT (default: BUILD/fuzz-out) to be added to corpus/ as a regression.
#
#   tests/fuzz/libfuzzer.sh SRC BUILD [RUNS | SECONDSs] [TARGET...]
#
# Targets: router json decode cluster model tokenizer zmtp openai xfer_blob
# client (default: all).  The last line of each target's run says how many
# inputs it executed.
#
# Exits 77 (skip) when clang or its libFuzzer runtime is missing
# (Debian: clang, libclang-rt-14-dev; tools/install-deps.sh --test).
set -eu
SRC=$1
BUILD=$2
RUNS=${3:-20000}
shift $(( $# >= 3 ? 3 : $# ))
TARGETS=${*:-router json decode cluster model tokenizer zmtp openai xfer_blob client}
CC=${FUZZ_CC:-clang}
OUT=${OUT:-$BUILD/fuzz-out}
command -v "$CC" >/dev/null 2>&1 || { echo "skip: $CC not found (apt install clang)"; exit 77; }
mkdir -p "$OUT"
probe="$OUT/probe.c"
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n){(void)d;(void)n;return 0;}' > "$probe"
if ! "$CC" -fsanitize=fuzzer "$probe" -o "$OUT/probe" 2>"$OUT/probe.err"; then
    echo "skip: $CC cannot link -fsanitize=fuzzer (install libclang-rt-14-dev): $(head -c 300 "$OUT/probe.err")"
    exit 77
fi
CFLAGS="-g -O1 -std=gnu11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all"
DATA="-DKVR_FUZZ_DATA=\"$SRC/tests/fuzz/data\""
INC="-I$SRC/common -I$BUILD/common -I$SRC/proto -I$BUILD/proto -I$SRC/router -I$SRC/tokenizer -I$SRC/sample -I$BUILD
     -I$SRC/engine -I$SRC/node -I$SRC/decode -I$SRC/transport -I$SRC/transport/cuda -I$SRC/router/client
     -I$SRC/frontend"
PKG=$(pkg-config --cflags --libs libprotobuf-c libzmq libxxhash yaml-0.1 libsodium)
# the meson-built router core last: only what the instrumented sources do not
# define comes from it (metrics hooks, and whatever module is added later)
LIBS="$BUILD/router/libkvr_router_core.a $BUILD/common/libkvr_metrics_http.a
      $BUILD/tokenizer/libkvr_tokenizer.a $BUILD/sample/libkvr_sample.a $BUILD/common/libkvr_common.a"
EXTRA=$(pkg-config --libs libutf8proc oniguruma 2>/dev/null || echo "-lutf8proc -lonig")
EXTRA="$EXTRA $(pkg-config --libs libmicrohttpd 2>/dev/null || true)"
# what the meson build links a target's plain driver with (the decode and
# model targets: node runtime, engine and its backends, transfer engine),
# the archives made absolute
meson_link() {
    sed -n "/^build tests\/fuzz\/$1:/,/LINK_ARGS/p" "$BUILD/build.ninja" | sed -n 's/^ LINK_ARGS = //p' |
        tr ' ' '\n' | while read -r a; do
            case $a in
            /*|-*|'') printf '%s ' "$a" ;;
            *) printf '%s ' "$BUILD/$a" ;;
            esac
        done
}
for t in $TARGETS; do
    case $t in
    router)
        srcs="$SRC/tests/fuzz/fuzz_router.c $SRC/proto/frame.c $SRC/proto/curve.c
              $BUILD/proto/kvrail_common.pb-c.c
              $BUILD/proto/kvrail_client.pb-c.c $BUILD/proto/kvrail_node.pb-c.c $SRC/common/json.c"
        for f in loop auth client_ep node_ep status registry dirsync streams failover dispatch requests \
                 send util directory scheduler; do
            srcs="$srcs $SRC/router/$f.c"
        done ;;
    json) srcs="$SRC/tests/fuzz/fuzz_json.c $SRC/common/json.c" ;;
    decode) # fuzz_decode.c includes decode/decode.c
        srcs="$SRC/tests/fuzz/fuzz_decode.c $SRC/node/blocktab.c $SRC/node/notif.c $SRC/proto/frame.c
              $BUILD/proto/kvrail_common.pb-c.c $BUILD/proto/kvrail_client.pb-c.c
              $BUILD/proto/kvrail_node.pb-c.c $(meson_link fuzz-decode)" ;;
    cluster) srcs="$SRC/tests/fuzz/fuzz_cluster.c $SRC/common/cluster.c" ;;
    model) srcs="$SRC/tests/fuzz/fuzz_model.c $SRC/engine/safetensors.c $SRC/engine/model.c
                 $SRC/common/json.c $(meson_link fuzz-model)" ;;
    tokenizer)
        srcs="$SRC/tests/fuzz/fuzz_tokenizer.c"
        for f in tokenizer tokenizer_bpe tokenizer_detok tokenizer_text tokenizer_pretok \
                 tokenizer_regex tokenizer_unigram; do
            srcs="$srcs $SRC/tokenizer/$f.c"
        done ;;
    zmtp) # the direct router link, NULL and CURVE (fuzz_zmtp.c plays the router)
        srcs="$SRC/tests/fuzz/fuzz_zmtp.c $SRC/router/client/zmtp.c $SRC/router/client/zmtp_curve.c" ;;
    openai) # the frontend's request parser and chat prompts
        srcs="$SRC/tests/fuzz/fuzz_openai.c $SRC/frontend/request.c $SRC/frontend/chat.c
              $SRC/common/json.c" ;;
    xfer_blob) # the transfer engine's blobs: its core and the backends the
        # meson build has (UCX when found; its parses run in a forked child)
        srcs="$SRC/tests/fuzz/fuzz_xfer_blob.c $SRC/transport/xfer.c $SRC/transport/xfer_mem.c
              $SRC/transport/xfer_token.c $SRC/transport/loop/loop.c"
        if grep -q 'transport/ucx/ucx\.c' "$BUILD/build.ninja"; then
            for f in ucx ucx_check ucx_hello ucx_local; do
                srcs="$srcs $SRC/transport/ucx/$f.c"
            done
        fi
        srcs="$srcs $(meson_link fuzz-xfer-blob)" ;;
    client) # libkvrail-client's handling of the router's frames (fuzz_client.c
        # includes router/client/client.c)
        srcs="$SRC/tests/fuzz/fuzz_client.c $SRC/router/client/zmtp.c $SRC/router/client/zmtp_curve.c
              $SRC/proto/frame.c $SRC/proto/curve.c $BUILD/proto/kvrail_common.pb-c.c
              $BUILD/proto/kvrail_client.pb-c.c $BUILD/proto/kvrail_node.pb-c.c" ;;
    *) echo "unknown target $t"; exit 2 ;;
    esac
    # shellcheck disable=SC2086
    "$CC" $CFLAGS $DATA $INC $srcs -o "$OUT/libfuzz-$t" $LIBS $PKG $EXTRA -lm -lpthread
    scratch="$OUT/corpus-$t"
    mkdir -p "$scratch"
    case $RUNS in
    *s) bound="-runs=-1 -max_total_time=${RUNS%s}" ;;
    *) bound="-runs=$RUNS" ;;
    esac
    maxlen=8192
    [ "$t" = model ] && maxlen=65536 # the tiny model's safetensors is 41 kB
    echo "== $t: $bound from $SRC/tests/fuzz/corpus/$t"
    status=0
    # shellcheck disable=SC2086
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$OUT/libfuzz-$t" $bound -seed=1 \
        -max_len=$maxlen -artifact_prefix="$OUT/crash-$t-" ${FUZZ_ARGS:-} \
        "$scratch" "$SRC/tests/fuzz/corpus/$t" >"$OUT/log-$t" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        tail -n 40 "$OUT/log-$t"
        echo "FAIL: $t exited $status; the input is in $OUT/crash-$t-*"
        exit 1
    fi
    grep -E '^Done [0-9]+ runs' "$OUT/log-$t" | sed "s/^/$t: /"
done
