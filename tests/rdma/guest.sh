#!/bin/sh
# guest.sh - runs inside the rdma test VM (booted by tests/rdma/vm.py),
# chrooted into the host's tree.  Creates the soft-RoCE devices and runs every
# guest test; each one leaves NAME.rc (exit status) and NAME.log in the
# results directory ($1), which vm.py hands to the meson test of that name.
#
#   rxe_lo  on lo                  GID 1 = ::ffff:127.0.0.1
#   rxe0    on veth0 (10.77.0.1)   rxe1 on veth1 (10.77.0.2)
#   rxe2    on veth2 (10.78.0.1)   rxe3 on veth3 (10.78.0.2)   (a second link)
#
# Every guest test runs under `timeout`; the whole VM is bounded by vm.py.
RES=$1
BUILD=$(dirname "$(dirname "$RES")")
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export KVR_LOG_LEVEL=${KVR_LOG_LEVEL:-info}
T0=$(date +%s)

log() { echo "guest: [$(($(date +%s) - T0)) s] $*"; }

# run NAME TIMEOUT CMD... : one guest test, result into $RES/NAME.{rc,log}
run() {
    name=$1
    t=$2
    shift 2
    s=$(date +%s)
    timeout -k 3 "$t" "$@" > "$RES/$name.log" 2>&1
    rc=$?
    [ $rc = 124 ] && echo "guest: $name timed out after ${t}s" >> "$RES/$name.log"
    echo $rc > "$RES/$name.rc"
    log "$name rc=$rc ($(($(date +%s) - s)) s)"
}

# fail_all REASON: the devices could not be set up; every test fails with it
fail_all() {
    for nt in $TESTS; do
        n=${nt%:*}
        echo "guest: soft-RoCE setup failed: $1" > "$RES/$n.log"
        echo 1 > "$RES/$n.rc"
    done
    exit 1
}

# name:timeout(s) of every guest test: first those on rxe_lo, then (once the
# veth GIDs exist) those on rxe0/rxe1
TESTS_LO="verbs_conformance:60 verbs_pair_lo:60 verbs_bad_rkey:30 verbs_kvrail_bench:60
       verbs_cluster_1p1d:120"
TESTS_VETH="rdma_devices:30 verbs_pair_veth:90 verbs_peer_death:60 verbs_mismatch:30
       verbs_failover:90 verbs_linkdown:240 verbs_cluster_linkdown:240"
# `vm.py --mode bench` (a file "mode" in the results directory) runs the benchmark only
if [ "$(cat "$RES/mode" 2>/dev/null)" = bench ]; then
    TESTS_LO="verbs_bench:1200"
    TESTS_VETH=
fi
# `vm.py --only A,B` (a file "only"): just those guest tests
pick_tests() {
    [ -s "$RES/only" ] || { echo "$*"; return; }
    for nt in "$@"; do
        case ",$(cat "$RES/only")," in *",${nt%:*},"*) echo "$nt" ;; esac
    done
}
TESTS_LO=$(pick_tests $TESTS_LO)
TESTS_VETH=$(pick_tests $TESTS_VETH)
TESTS="$TESTS_LO $TESTS_VETH"
BIN=$BUILD/tests/rdma

log "start (uptime $(cut -d' ' -f1 /proc/uptime) s)"
modprobe rdma_rxe || fail_all "modprobe rdma_rxe"
modprobe veth || fail_all "modprobe veth"
log "modules loaded"
ip link set lo up
rdma link add rxe_lo type rxe netdev lo || fail_all "rdma link add rxe_lo"
log "rxe_lo created"
ip link add veth0 type veth peer name veth1 || fail_all "ip link add veth"
ip addr add 10.77.0.1/24 dev veth0
ip addr add 10.77.0.2/24 dev veth1
ip link set veth0 up
ip link set veth1 up
rdma link add rxe0 type rxe netdev veth0 || fail_all "rdma link add rxe0"
rdma link add rxe1 type rxe netdev veth1 || fail_all "rdma link add rxe1"
# the second link: verbs_linkdown takes links down under a transfer; without
# DAD its link-local GIDs come back as soon as a link is up again
ip link add veth2 type veth peer name veth3 || fail_all "ip link add veth2"
for i in 0 1 2 3; do echo 0 > /proc/sys/net/ipv6/conf/veth$i/accept_dad; done
ip addr add 10.78.0.1/24 dev veth2
ip addr add 10.78.0.2/24 dev veth3
ip link set veth2 up
ip link set veth3 up
rdma link add rxe2 type rxe netdev veth2 || fail_all "rdma link add rxe2"
rdma link add rxe3 type rxe netdev veth3 || fail_all "rdma link add rxe3"
log "rxe0, rxe1, rxe2, rxe3 created"

# wait (bounded) until the link-local and IPv4-mapped GIDs of both veth devices exist
wait_veth_gids() {
    i=0
    while [ $i -lt 100 ]; do
        a=$(cat /sys/class/infiniband/rxe0/ports/1/gids/0 /sys/class/infiniband/rxe0/ports/1/gids/1 \
            /sys/class/infiniband/rxe1/ports/1/gids/0 /sys/class/infiniband/rxe1/ports/1/gids/1 \
            /sys/class/infiniband/rxe2/ports/1/gids/0 /sys/class/infiniband/rxe2/ports/1/gids/1 \
            /sys/class/infiniband/rxe3/ports/1/gids/0 /sys/class/infiniband/rxe3/ports/1/gids/1 2>/dev/null)
        case "$a" in fe80*ffff:0a4d:0001*fe80*ffff:0a4d:0002*fe80*ffff:0a4e:0001*fe80*ffff:0a4e:0002*) break ;; esac
        sleep 0.1
        i=$((i + 1))
    done
    rdma link show
    for d in rxe_lo rxe0 rxe1 rxe2 rxe3; do
        for g in 0 1; do
            echo "$d gid[$g] $(cat /sys/class/infiniband/$d/ports/1/gids/$g 2>/dev/null)" \
                "$(cat /sys/class/infiniband/$d/ports/1/gid_attrs/types/$g 2>/dev/null)"
        done
    done
    log "veth GIDs ready"
}

# the command of each guest test
cmd_of() {
    case $1 in
    rdma_devices) echo "ibv_devices | grep -q rxe_lo && ibv_devices | grep -q rxe0 && ibv_devices | grep -q rxe1 &&
        (ibv_rc_pingpong -d rxe0 -g 0 -n 20 & i=0; sleep 1;
         until ibv_rc_pingpong -d rxe1 -g 0 -n 20 127.0.0.1; do
             i=\$((i + 1)); [ \$i -ge 10 ] && exit 1; sleep 1; done; wait)" ;;
    verbs_conformance) echo "[ -x $BUILD/tests/unit/test_xfer_conformance ] || { echo 'test_xfer_conformance not built'; exit 77; };
        KVR_VERBS_DEVICES=rxe_lo $BUILD/tests/unit/test_xfer_conformance verbs" ;;
    verbs_pair_lo) echo "$BIN/test_verbs_pair --case pair --dev-a rxe_lo --dev-b rxe_lo" ;;
    verbs_pair_veth) echo "$BIN/test_verbs_pair --case pair --dev-a rxe0 --dev-b rxe1 --gid-a 0 --gid-b 0 &&
        $BIN/test_verbs_pair --case pair --dev-a rxe0:1:0,rxe_lo:1:1 --dev-b rxe1:1:0,rxe_lo:1:1 --rounds 2" ;;
    verbs_peer_death) echo "$BIN/test_verbs_pair --case death --dev-a rxe0 --dev-b rxe1 --gid-a 0 --gid-b 0" ;;
    verbs_failover) echo "$BIN/test_verbs_pair --case failover --dev-a rxe0:1:0,rxe_lo:1:1 --dev-b rxe1:1:0,rxe_lo:1:1" ;;
    verbs_linkdown) echo "$BIN/test_verbs_pair --case linkdown --dev-a rxe0:1:0,rxe2:1:0 --dev-b rxe1:1:0,rxe3:1:0 \
        --link0 veth0 --link1 veth2 --mib 256" ;;
    verbs_bad_rkey) echo "$BIN/test_verbs_pair --case badkey --dev-a rxe_lo --dev-b rxe_lo" ;;
    verbs_mismatch) echo "$BIN/test_verbs_pair --case mismatch --dev-a rxe0 --dev-b rxe1" ;;
    verbs_kvrail_bench) echo "$BUILD/tools/bench/kvrail-bench --backend verbs --devices rxe_lo --pool-size 16M \
        --sizes 64K --batch 1,16 --duration 0.2 --check --quiet" ;;
    verbs_cluster_1p1d) echo "KVR_VERBS_DEVICES=rxe_lo python3 tests/rdma/cluster_verbs.py $BUILD" ;;
    verbs_cluster_linkdown) echo "python3 tests/rdma/cluster_verbs.py $BUILD --linkdown" ;;
    verbs_bench) echo "python3 tests/rdma/bench-vm.py $BUILD" ;;
    esac
}

run_list() {
for nt in "$@"; do
    n=${nt%:*}
    tmo=${nt#*:}
    cmd=$(cmd_of "$n")
    if [ -z "$cmd" ]; then
        echo "guest: no command for $n" > "$RES/$n.log"
        echo 1 > "$RES/$n.rc"
        continue
    fi
    run "$n" "$tmo" /bin/sh -c "$cmd"
done
}

run_list $TESTS_LO
if [ -n "$TESTS_VETH" ]; then
    wait_veth_gids
    run_list $TESTS_VETH
fi
log "all guest tests done after $(($(date +%s) - T0)) s"
exit 0
