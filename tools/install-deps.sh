#!/bin/sh
# install-deps.sh - installs the Debian 12 packages kvrail needs (apt-get, as root).
#   tools/install-deps.sh          build + run
#   tools/install-deps.sh --test   also what the test suite needs
#   tools/install-deps.sh --bench  also what the benchmarks compare against (PyTorch)
# Every package is named here; nothing is assumed to be on the machine.
set -e
PKGS="build-essential meson ninja-build pkg-config
      libucx-dev ucx-utils libibverbs-dev rdma-core ibverbs-providers
      libzmq3-dev libsodium-dev protobuf-c-compiler libprotobuf-c-dev
      libopenblas-dev libxxhash-dev libyaml-dev python3 python3-yaml
      libmicrohttpd-dev
      libutf8proc-dev libonig-dev"
TEST_PKGS="python3-numpy python3-jinja2 iproute2 procps psmisc clang-format prometheus
      qemu-system-x86 linux-image-amd64 busybox-static kmod cpio ibverbs-utils perftest gnuplot-nox
      slurm-wlm munge systemd man-db mmdebstrap
      clang libclang-rt-14-dev
"
BENCH_PKGS="python3-torch"   # tools/bench-engine's PyTorch side
case "$1" in
--bench)
    PKGS="$PKGS $TEST_PKGS $BENCH_PKGS"
    command -v npm >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
    ;;
--test)
    PKGS="$PKGS $TEST_PKGS"
    # Node.js for the tokenizer oracle: use the machine's own if it has one
    # (a newer node outside dpkg must not be replaced by Debian's).
    command -v npm >/dev/null 2>&1 || PKGS="$PKGS nodejs npm"
    ;;
esac
SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
missing=
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "install-deps: apt-get install$missing" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
