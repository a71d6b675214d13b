#!/bin/sh
# bench-vm.sh BUILD - the verbs benchmark, run inside the rdma test VM by
#   tests/rdma/vm.py --build-dir BUILD --guest tests/rdma/guest.sh --cwd . --mode bench
# kvrail-bench --backend verbs beside perftest's ib_write_bw on the same
# soft-RoCE device (rxe_lo, GID 1 = ::ffff:127.0.0.1) and the same message
# sizes (tools/bench-transfer prints the ratio), then the CPU cost per posted
# descriptor (post time / descriptors, 4 KiB descriptors posted 256 at a time).
BUILD=$1
set -x
python3 tools/bench-transfer --verbs rxe_lo --gid-index 1 --bench "$BUILD/tools/bench/kvrail-bench" \
    --sizes 64K,256K,1M,4M --reps ${KVR_BENCH_REPS:-2} --duration 2 --bytes 256M --pool-size 128M \
    --no-hot --timeout 300 || echo "bench-transfer failed: $?"
for b in 1 16 256; do
    "$BUILD/tests/rdma/test_verbs_pair" --case bench --dev-a rxe_lo --dev-b rxe_lo --size 4096 \
        --batch $b --iters 200
done
"$BUILD/tests/rdma/test_verbs_pair" --case bench --dev-a rxe_lo --dev-b rxe_lo --size 65536 \
    --batch 16 --iters 100
exit 0
