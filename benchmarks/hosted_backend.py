"""What a hosted row pays at level 1 (d500.networks.hosted): the reference backend on mlp-mnist
timed in d500's process (as a built-in row is) and in a backend host (as a third-party row is:
round trips of `inner` calls, the last on inputs the judge shifted), interleaved round by round.

Per timed call (latency at batch 1, throughput's pass at batch 64, a training step at batch 64)
it prints the median per-call wall time of each, their ratio hosted / in-process with the IQR of
the per-round ratios, the empty round trip's share of a round trip as sized (the rule: under
1 %), and the share of a round trip outside the host's own reading of its calls (the pipe, the
shift of the last call's inputs and the host's wake-up, as they were while timing).

    .venv/bin/python benchmarks/hosted_backend.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

from d500 import threads
from d500.backends import get
from d500.heap import allocator
from d500.networks import bench, workloads
from d500.networks.bench import TRIPS
from d500.networks.hosted import HostedBackend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--workload", default="mlp-mnist")
    parser.add_argument("--trip", type=float, default=2.0 / TRIPS,
                        help="round trips at least this long, seconds (default: as net bench "
                             "asks at a 2 s budget; 0: level 0's sizing alone)")
    parser.add_argument("--case", help="only the calls whose label holds this (latency, pass, "
                                       "training)")
    args = parser.parse_args()
    only = args.case
    threads.configure(1, ["numpy"])
    allocator()  # the judge's heap as its hosts' (net bench does so)
    wl = workloads.load(workloads.find(args.workload))
    model, path = wl.onnx_model()
    feeds1, feeds_b = bench.bench_inputs(wl, model)
    train_model, train_path = bench.training_model(wl, model, path)
    train_feeds = bench.training_inputs(wl, train_model)
    host = HostedBackend.start("reference")
    try:
        local, remote = get("reference").prepare(str(path)), host.prepare(path)
        local_t, remote_t = get("reference").prepare(str(train_path)), host.prepare(train_path)
        wrt = list(local_t.parameter_names)
        cases = [
            ("latency, batch 1", lambda: local.run(feeds1),
             lambda trip: remote.timed("forward", feeds1, trip=trip)),
            (f"pass, batch {wl.batch_size}", lambda: local.run(feeds_b),
             lambda trip: remote.timed("forward", feeds_b, trip=trip)),
            (f"training step, batch {wl.batch_size}",
             lambda: local_t.gradients(train_feeds, output=wl.loss_output, wrt=wrt),
             lambda trip: remote_t.timed("step", train_feeds, wl.loss_output, wrt, trip))]
        print(f"{wl.name}, reference backend, {args.rounds} rounds, 1 thread, round trips of "
              f"at least {args.trip:g} s")
        print(f"{'call':<28}{'in-process':>12}{'hosted':>12}{'ratio':>8}{'IQR':>16}"
              f"{'inner':>8}{'empty/trip':>12}{'pipe/trip':>11}")
        for label, call, make in cases:
            if only and only not in label:
                continue
            timed = make(args.trip)  # sized now, as net bench sizes each before timing it
            ins, hos, own = [], [], []
            for r in range(args.rounds):
                def here() -> None:
                    t = time.perf_counter()
                    for _ in range(timed.inner):
                        call()
                    ins.append((time.perf_counter() - t) / timed.inner)

                def there() -> None:
                    t = time.perf_counter()
                    inside, _ = timed._ask(timed.inner)  # what a timed sample runs
                    hos.append((time.perf_counter() - t) / timed.inner)
                    own.append(float(inside) / timed.inner)
                for fn in ((here, there) if r % 2 == 0 else (there, here)):
                    fn()
            ratios = sorted(h / i for h, i in zip(hos, ins))
            q = statistics.quantiles(ratios, n=4, method="inclusive")
            trip = statistics.median(hos) * timed.inner
            pipe = statistics.median(h - o for h, o in zip(hos, own)) / statistics.median(hos)
            print(f"{label:<28}{statistics.median(ins) * 1e6:>10.1f}us"
                  f"{statistics.median(hos) * 1e6:>10.1f}us{statistics.median(ratios):>8.3f}"
                  f"{f'[{q[0]:.3f}, {q[2]:.3f}]':>16}{timed.inner:>8}"
                  f"{timed.overhead / trip:>11.2%}{pipe:>11.2%}")
    finally:
        host.close()


if __name__ == "__main__":
    main()
