#!/bin/sh
# libfuzzer.sh - builds tests/fuzz's targets with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer (every report fatal) and
# runs each for RUNS inputs from its seed corpus (CI: a short bounded run;
# a long campaign: RUNS=-1 with -max_total_time in FUZZ_ARGS).  The code
# under test (router modules, framing, protobuf decoders, JSON) is compiled
# here with clang so libFuzzer sees its coverage; the rest (tokenizer,
# sampler, common) is linked from the meson build.  New inputs found go to a
# scratch directory, not the committed corpus; a crash leaves its input in
# $OUT (default: BUILD/fuzz-out) to be added to corpus/ as a regression.
#
#   tests/fuzz/libfuzzer.sh SRC BUILD [RUNS] [TARGET...]
#
# Exits 77 (skip) when clang or its libFuzzer runtime is missing
# (Debian: clang, libclang-rt-14-dev; tools/install-deps.sh --test).
set -eu
SRC=$1
BUILD=$2
RUNS=${3:-20000}
shift $(( $# >= 3 ? 3 : $# ))
TARGETS=${*:-router json}
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
INC="-I$SRC/common -I$BUILD/common -I$SRC/proto -I$BUILD/proto -I$SRC/router -I$SRC/tokenizer -I$SRC/sample -I$BUILD"
PKG=$(pkg-config --cflags --libs libprotobuf-c libzmq libxxhash yaml-0.1)
# the meson-built router core last: only what the instrumented sources do not
# define comes from it (metrics hooks, and whatever module is added later)
LIBS="$BUILD/router/libkvr_router_core.a $BUILD/common/libkvr_metrics_http.a
      $BUILD/tokenizer/libkvr_tokenizer.a $BUILD/sample/libkvr_sample.a $BUILD/common/libkvr_common.a"
EXTRA=$(pkg-config --libs libutf8proc oniguruma 2>/dev/null || echo "-lutf8proc -lonig")
EXTRA="$EXTRA $(pkg-config --libs libmicrohttpd 2>/dev/null || true)"
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
    *) echo "unknown target $t"; exit 2 ;;
    esac
    # shellcheck disable=SC2086
    "$CC" $CFLAGS $INC $srcs -o "$OUT/libfuzz-$t" $LIBS $PKG $EXTRA -lm -lpthread
    scratch="$OUT/corpus-$t"
    mkdir -p "$scratch"
    echo "== $t: $RUNS runs from $SRC/tests/fuzz/corpus/$t"
    status=0
    # shellcheck disable=SC2086
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$OUT/libfuzz-$t" -runs="$RUNS" -seed=1 \
        -max_len=8192 -artifact_prefix="$OUT/crash-$t-" ${FUZZ_ARGS:-} \
        "$scratch" "$SRC/tests/fuzz/corpus/$t" >"$OUT/log-$t" 2>&1 || status=$?
    tail -n 40 "$OUT/log-$t"
    if [ "$status" -ne 0 ]; then
        echo "FAIL: $t exited $status; the input is in $OUT/crash-$t-*"
        exit 1
    fi
done
