"""What a hosted row pays at level 1 (d500.networks.hosted), and what checking every call costs:
the reference backend on mlp-mnist timed three ways, interleaved round by round: in d500's
process as plain calls (the loop built-in rows ran before every call was checked), in d500's
process as checked round trips (`checked_local`: as a built-in row runs now), and in a backend
host (as a third-party row runs: round trips of `inner` calls, each on inputs the judge shifted,
each returning its outputs' checksums).

Per timed call (latency at batch 1, throughput's pass at batch 64, a training step at batch 64)
it prints the median per-call wall time of each; the check's cost, checked / plain in-process;
what hosting costs more, hosted / checked in-process (the rows net bench compares); hosted /
plain in-process (the ratio this benchmark printed when only each round trip's last call was
checked), each with the IQR of the per-round ratios; the empty round trip's share of a round
trip as sized (the rule: under 1 %); the share of a round trip outside the host's own reading
of its calls (the pipe and the host's wake-up, as they were while timing); and, the hosted
calls checked with the reference after timing (CHECKED calls), the share of pairs of them the
check tells apart (its power, `calls_told_apart`, the shifts sized first as net bench sizes
them).

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
from d500.networks.hosted import HostedBackend, checked_local


def _iqr(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return f"[{q[0]:.3f}, {q[2]:.3f}]"


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
        steps = {"output": wl.loss_output, "wrt": wrt}
        cases = [  # (label, plain call, kind, the executable here, the hosted one, feeds, how)
            ("latency, batch 1", lambda: local.run(feeds1), "forward", local, remote, feeds1, {}),
            (f"pass, batch {wl.batch_size}", lambda: local.run(feeds_b), "forward", local,
             remote, feeds_b, {}),
            (f"training step, batch {wl.batch_size}",
             lambda: local_t.gradients(train_feeds, output=wl.loss_output, wrt=wrt), "step",
             local_t, remote_t, train_feeds, steps)]
        print(f"{wl.name}, reference backend, {args.rounds} rounds, 1 thread, hosted round "
              f"trips of at least {args.trip:g} s")
        print(f"{'call':<24}{'plain':>9}{'checked':>10}{'hosted':>10}{'checked/plain':>22}"
              f"{'hosted/checked':>22}{'hosted/plain':>22}{'inner':>7}{'empty':>7}{'pipe':>7}"
              f"{'told':>6}")
        for label, call, kind, here_exe, there_exe, feeds, how in cases:
            if only and only not in label:
                continue
            # sized now, as net bench sizes each before timing it (its shifts with the reference)
            reference = get("reference").prepare(str(train_path if kind == "step" else path))
            hosted = there_exe.timed(kind, feeds, how.get("output"), how.get("wrt"), args.trip,
                                     reference)
            checked = checked_local(here_exe, kind, feeds, how.get("output"), how.get("wrt"))
            plain, mine, hos, own = [], [], [], []
            for r in range(args.rounds):
                def here() -> None:
                    t = time.perf_counter()
                    for _ in range(hosted.inner):
                        call()
                    plain.append((time.perf_counter() - t) / hosted.inner)

                def here_checked() -> None:
                    t = time.perf_counter()
                    checked()  # what a built-in row's timed sample runs
                    mine.append((time.perf_counter() - t) / checked.inner)

                def there() -> None:
                    t = time.perf_counter()
                    inside, _ = hosted._ask(hosted.inner)  # what a hosted timed sample runs
                    hos.append((time.perf_counter() - t) / hosted.inner)
                    own.append(float(inside) / hosted.inner)
                order = [here, here_checked, there]
                for fn in order[r % 3:] + order[:r % 3]:
                    fn()
            wrong = hosted.check(reference)
            trip = statistics.median(hos) * hosted.inner
            pipe = statistics.median(h - o for h, o in zip(hos, own)) / statistics.median(hos)
            told = "-" if hosted.power is None else f"{hosted.power:.2f}"
            print(f"{label:<24}{statistics.median(plain) * 1e6:>7.1f}us"
                  f"{statistics.median(mine) * 1e6:>8.1f}us{statistics.median(hos) * 1e6:>8.1f}us"
                  + "".join(f"{statistics.median(rs):>7.3f} {_iqr(rs):>14}" for rs in (
                      [m / p for m, p in zip(mine, plain)], [h / m for h, m in zip(hos, mine)],
                      [h / p for h, p in zip(hos, plain)]))
                  + f"{hosted.inner:>7}{hosted.overhead / trip:>7.2%}{pipe:>7.2%}{told:>6}")
            if wrong:  # the reference disagreeing with itself: a bug in the check
                print(f"  the check failed: {wrong}")
    finally:
        host.close()


if __name__ == "__main__":
    main()
