"""Reproduce's time comparison, made only on the origin's hardware, and the odds that a draw of K
runs of N holds at least one of F forged ones (so an organiser can choose K).

Times depend on the machine, so they are compared only when this machine's hardware key
(d500.leaderboard.environments.machine: CPU model, logical cores, memory, GPUs, architecture)
equals the run's. Then a recorded time much faster than its reproduction is a disagreement: a
time to accuracy halved in the figures, the evaluations and the MLLOG alike, re-sealed, passes
`d500 check` (the log agrees with itself) but not a re-run.

Why the tolerance (the reproduction may take up to RATIO x the recorded time + SLACK_S): the
same run repeated on one machine (digits-mlp, sgd-momentum, seed 0, torch, 1 thread, 6 runs
here on 2 cores with three other engineers' tests running, 1-minute load 4.1-4.7) met the
target in 0.296-0.465 s: the slowest 1.57x the fastest, every evaluation's wall time within the
same spread. RATIO 1.5 plus SLACK_S 0.05 s (scheduler noise, larger than the spread on runs of
a fraction of a second) accepts every pair of those runs; a time halved is 2x. Load only ever
slows the reproduction: on a machine its own LoadWatch marked loaded (others' load above a
quarter of the usable cores) the ratio is widened by 1 + others' load / cores, about the most
that load can slow a run sharing those cores (an honest digits reproduction on this loaded
machine ran 1.69x slower than its recorded run). Load can then hide a halved time: reproduce
on an idle machine. Only the recorded time being too fast is judged: a slower
recorded time gives the sender nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from d500.competition.reproduce_compare import Check

RATIO = 1.5
SLACK_S = 0.05
TOLERANCE = f"reproduced at most {RATIO:g}x recorded + {SLACK_S:g} s (same hardware)"


def hardware_note(origin: dict[str, Any] | None, here: dict[str, Any] | None) -> tuple[bool, str]:
    """(whether the two provenances share a hardware key, the line that says so)."""
    from d500.leaderboard.environments import hardware_text, machine
    theirs, ours = machine(origin), machine(here)
    if theirs and theirs == ours:
        return True, f"times compared: this machine's hardware is the run's (key {ours})"
    return False, (f"times not compared: this machine's hardware ({hardware_text(here)}, key "
                   f"{ours or '-'}) is not the run's ({hardware_text(origin)}, key "
                   f"{theirs or '-'})")


def too_fast(recorded: float, reproduced: float, slowdown: float = 1.0,
             slack: float = SLACK_S) -> bool:
    """Whether a recorded time is faster than its reproduction allows, the reproduction slowed
    by load at most `slowdown` times."""
    return reproduced > RATIO * slowdown * recorded + slack


def slowdown(load: dict[str, Any] | None) -> float:
    """The most a reproduction's LoadWatch record says load slowed it: 1 + others' load (what
    they took during it, where measured, else the load averages') / usable cores when it marked
    the machine loaded, else 1."""
    load = load or {}
    during = load.get("during")
    others = [during] if isinstance(during, (int, float)) else [
        v for v in load.get("others") or [] if isinstance(v, (int, float))]
    cores = load.get("usable_cores")
    if not load.get("loaded") or not others or not isinstance(cores, (int, float)) or cores <= 0:
        return 1.0
    return 1.0 + max(others) / cores


def walls(evaluations: Sequence[Any]) -> dict[int, float]:
    """{step: wall time} from ledger evaluation dicts or packaged rows [step, epoch, wall, ...]."""
    out = {}
    for e in evaluations:
        step, wall = (e.get("step"), e.get("wall_time")) if isinstance(e, dict) else (e[0], e[2])
        if isinstance(wall, (int, float)) and math.isfinite(wall) and step is not None:
            out[int(step)] = float(wall)
    return out


def time_checks(recorded: dict[str, Any], reproduced: dict[str, Any],
                evaluations: tuple[Sequence[Any], Sequence[Any]],
                load: float = 1.0) -> list[Check]:
    """Time to accuracy and the evaluations' wall times, recorded against reproduced (call
    only on the run's hardware); `load`: the reproduction's `slowdown`."""
    tolerance = TOLERANCE if load == 1.0 else (
        f"reproduced at most {RATIO:g}x{load:.2f} recorded + {SLACK_S:g} s (same hardware; "
        f"x{load:.2f}: this machine was loaded while reproducing)")
    checks = []
    a, b = recorded.get("time_to_accuracy"), reproduced.get("time_to_accuracy")
    if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b)):
        checks.append(Check("time_to_accuracy", a, b, tolerance, not too_fast(a, b, load),
                            f"reproduced {b / a:.2f}x the recorded time" if a > 0 else ""))
    mine, theirs = walls(evaluations[0]), walls(evaluations[1])
    common = sorted(s for s in set(mine) & set(theirs) if mine[s] > 0)
    if common:  # how many times slower the reproduction ran: least squares through 0, which
        # weighs the later, longer evaluations most; judged at the last common evaluation
        slope = (sum(mine[s] * theirs[s] for s in common) / sum(mine[s] ** 2 for s in common))
        last = mine[common[-1]]
        checks.append(Check("evaluation times", last, slope * last,
                            f"{tolerance}, at the last of {len(common)} common evaluations as "
                            "fitted to all of them", not too_fast(last, slope * last, load),
                            f"reproduced {slope:.2f}x the recorded wall times (least squares "
                            f"over {len(common)} common evaluations)"))
    return checks


# a bench run's timed figures (levels 0 and 1): medians of many timed calls, in seconds
LATENCIES = ("latency", "backward_latency", "train_step_time")
RATES = ("throughput",)  # samples per second: a forged one is higher


def latency_checks(recorded: dict[str, Any], reproduced: dict[str, Any], load: float = 1.0
                   ) -> list[Check]:
    """A bench run's timed figures, recorded against benched again (call only on the run's
    hardware): a time may be reproduced at most RATIO (x `load`) x recorded, a rate at least
    recorded / (RATIO x `load`). No slack in seconds: each is a median of many calls, and one
    would hide a forged microsecond (mlp-mnist's latency divided by 100 passed 0.1 ms of it)."""
    tolerance = (f"reproduced at most {RATIO:g}x{load:.2f} recorded "
                 f"(same hardware{'' if load == 1.0 else '; loaded'})")
    out = []
    for name in (*LATENCIES, *RATES):
        a, b = recorded.get(name), reproduced.get(name)
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (a, b)):
            continue
        slow = (a, b) if name in LATENCIES else (1.0 / a, 1.0 / b)  # a rate as time per sample
        out.append(Check(name, a, b, tolerance if name in LATENCIES else
                         tolerance.replace("at most", "a time per sample at most"),
                         not too_fast(*slow, load, 0.0),
                         f"reproduced {slow[1] / slow[0]:.2f}x the recorded time"))
    return out


def pooled(pairs: Sequence[tuple[float, float, float]]) -> Check | None:
    """The draw's runs timed on their own hardware, judged together: (recorded, reproduced,
    slowdown) per run, their times to accuracy summed. One run's SLACK_S cannot resolve a
    halved time on a run of a fraction of a second (0.11 s recorded, 0.22 s reproduced: within
    1.5x + 0.05 s); a sender halves every run alike to keep the package consistent, and the sum
    of K such runs grows as K while the scheduler noise of K independent runs grows as sqrt(K),
    so the slack of the sum is SLACK_S x sqrt(K). None for fewer than two runs."""
    if len(pairs) < 2:
        return None
    recorded, reproduced = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    load, slack = max(p[2] for p in pairs), SLACK_S * math.sqrt(len(pairs))
    factor, loaded = (f"{RATIO:g}x", "") if load == 1.0 else (
        f"{RATIO:g}x{load:.2f}", f"; x{load:.2f}: this machine was loaded while reproducing")
    return Check(f"time_to_accuracy, {len(pairs)} runs summed", recorded, reproduced,
                 f"reproduced at most {factor} recorded + {slack:.3f} s "
                 f"({SLACK_S:g} s x sqrt({len(pairs)}); same hardware{loaded})",
                 not too_fast(recorded, reproduced, load, slack),
                 f"reproduced {reproduced / recorded:.2f}x the recorded time"
                 if recorded > 0 else "")


def at_least_one(n: int, k: int, forged: int) -> float:
    """The probability that K runs drawn without replacement from N hold at least one of F
    forged runs: 1 - C(N-F, K) / C(N, K) (hypergeometric)."""
    if not 0 <= forged <= n or not 0 <= k <= n:
        raise ValueError(f"need 0 <= F, K <= N, got N={n} K={k} F={forged}")
    return 1.0 - math.comb(n - forged, k) / math.comb(n, k)


def runs_for(n: int, forged: int, chance: float = 0.95) -> int:
    """The fewest runs K to draw from N so that at least one of F forged is drawn with
    `chance`."""
    return next(k for k in range(n + 1) if at_least_one(n, k, forged) >= chance - 1e-12)


def odds(n: int, k: int) -> dict[str, Any]:
    """The draw's detection odds for F = 1, 2, 3 forged runs (those N holds): the chance this
    draw holds one, and the K that would make it 95%."""
    counts = [f for f in (1, 2, 3) if f <= n]
    return {"drawn": k, "of": n,
            "at_least_one_forged": {f: at_least_one(n, k, f) for f in counts},
            "runs_for_95": {f: runs_for(n, f) for f in counts}}


def odds_line(n: int, k: int) -> str:
    """The odds in words, for reproduce's report."""
    found = odds(n, k)
    chances = ", ".join(f"{p:.0%} if {f} {'is' if f == 1 else 'are'}"
                        for f, p in found["at_least_one_forged"].items())
    needed = ", ".join(f"--runs {r} for {f}" for f, r in found["runs_for_95"].items())
    return (f"a draw of {k} of {n} holds at least one forged run with probability {chances} "
            f"forged (1 - C(N-F,K)/C(N,K)); 95% needs {needed}")
