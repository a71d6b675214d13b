"""reserve_timeout_test.py - a decode node that leaves its Reserves
unanswered past timeouts.prefill_ms, while the router still counts it alive
(its heartbeat timeout is longer), takes the blame: the router releases its
reservation and dispatches the request to another decode node (issue 12).

1P+2D, real nodes; heartbeat_timeout_ms 30000, prefill_ms 1500.  decode0 is
SIGSTOPped, so every Reserve sent to it stays unanswered and its own local
prefills give no first token; the router keeps it alive the whole time.
Asserted:
 - every request (long prompts, prefilled on prefill0; short ones,
   prefilled on the decode node) completes with exactly `kvrail run`'s
   tokens and logprobs;
 - the router's status blames decode0 (failures_blamed > 0) and never
   prefill0: the old router retried the prefill on prefill0 and blamed no
   node;
 - once decode0 is woken, both decode nodes are alive and every pool is
   back at its baseline (decode0's stale reservations are canceled or run
   out their lease: no block is stranded).
"""
import random
import signal

from cluster_lib import (check, check_outputs, Cluster, reference, run_main, test_start, wait_for)


def node(st, name):
    return next(n for n in st["nodes"] if n["name"] == name)


def main():
    args, bins, wd, model = test_start("kvr-reserve-timeout-")
    c = Cluster(bins, wd, model, n_prefill=1, n_decode=2, heartbeat_timeout_ms=30000,
                prefill_ms=1500, lease_ms=5000, queue_ms=30000)
    rng = random.Random(11)
    prompts = [([rng.randrange(4, 512) for _ in range(n)], 6)
               for n in (120, 3, 200, 5, 90, 150, 7, 64)]
    ref = reference(bins, model, prompts)
    stopped = False
    try:
        c.start()
        # both pools whole in the router's view (a pool is faulted in the
        # background after registration, and the scheduler prefers the node
        # with more free blocks): the load is then spread over both
        c.wait_idle(timeout=30)
        wait_for("the router to see both decode pools whole",
                 lambda: all(node(s, n)["free_blocks"] == node(s, n)["total_blocks"]
                             for n in c.decodes) if (s := c.status()) else False, timeout=30)
        c.kill("decode0", signal.SIGSTOP)
        stopped = True
        rc, outs, log = c.loadgen(prompts, extra=("--concurrency", "8"))
        check_outputs(outs, ref, what="decode0 stopped")
        st = c.status()
        check(st is not None, "the router did not answer status")
        d0, d1, p0 = node(st, "decode0"), node(st, "decode1"), node(st, "prefill0")
        check(d0["alive"], "decode0 was declared dead: the test needs it alive to the router")
        check(d0["failures_blamed"] > 0,
              "decode0 left Reserves unanswered but was never blamed: %s" % d0)
        check(p0["failures_blamed"] == 0,
              "prefill0 was blamed for decode0's silence: %s" % p0)
        print("decode0 stopped: %d requests completed equal to kvrail run; decode0 blamed %d "
              "times (cool-downs %d), prefill0 %d" % (len(outs), d0["failures_blamed"],
                                                      d0["cooldowns"], p0["failures_blamed"]))
        c.kill("decode0", signal.SIGCONT)
        stopped = False
        wait_for("both decode nodes alive",
                 lambda: all(node(s, n)["alive"] for n in c.decodes)
                 if (s := c.status()) else False, timeout=30)
        c.wait_idle(timeout=30)
        c.check_alive()
        print("decode0 woken: alive, every pool at its baseline")
    finally:
        if stopped:
            c.kill("decode0", signal.SIGCONT)
        c.stop()
    return 0


if __name__ == "__main__":
    run_main(main)
