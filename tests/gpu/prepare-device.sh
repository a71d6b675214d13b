#!/bin/sh
# prepare-device.sh BUILD_DIR [DEST] - packs what tests/gpu/run-device.sh
# runs on the GPU machine, whose image has nvcc and Python but not this
# project's libraries (libzmq, protobuf-c, libyaml, UCX, ...): the CUDA
# build's binaries (stripped), the shared libraries they load that are not
# glibc's or the CUDA toolkit's, and the generated kvr_config.h.  DEST
# (default gpu-carry/ in the repository root, ignored through
# .git/info/exclude) then travels with the device tool's `carry`.
set -eu
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${2:-$root/gpu-carry}
grep -qx '/gpu-carry/' "$root/.git/info/exclude" 2>/dev/null || echo '/gpu-carry/' >>"$root/.git/info/exclude"
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/include"
bins="tests/gpu/test_backend_ops tests/gpu/test_cuda_ipc tests/gpu/test_cuda_stage tests/gpu/test_nccl tests/gpu/bench_gpu tools/kvrail/kvrail tools/mkmodel/kvrail-mkmodel
      decode/kvrail-decode prefill/kvrail-prefill router/kvrail-router tools/loadgen/kvrail-loadgen"
for b in $bins; do
    [ -x "$build/$b" ] || { echo "prepare-device: $build/$b not built (ninja -C $build)" >&2; exit 1; }
    cp "$build/$b" "$dest/bin/"
    strip --strip-debug "$dest/bin/$(basename "$b")"
done
# the libraries: everything ldd resolves except glibc's own, the C++
# runtime (newer there) and CUDA's (the toolkit there)
for b in $bins; do ldd "$build/$b"; done | awk '/=> \// {print $3}' | sort -u | while read -r l; do
    case "$(basename "$l")" in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libresolv.so* | ld-linux* | \
        libstdc++.so* | libgcc_s.so* | libcuda* | libcublas* | libcudart* | libnccl*) ;;
    *) cp -L "$l" "$dest/lib/" ;;
    esac
done
cp "$build/kvr_config.h" "$dest/include/"
du -sh "$dest"
