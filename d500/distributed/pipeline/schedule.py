"""Pipeline schedules: the order in which one stage runs the forward (F) and backward (B) passes of
a step's M micro-batches, and the bubble theory says they leave idle.

    ops("1f1b", stage=0, stages=2, micro=4)   # [F0, F1, B0, F2, B1, F3, B2, B3]

- GPipe (Huang et al. 2019): every forward, then every backward; a stage keeps the inputs of
  all M micro-batches until their backward.
- 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage s runs min(P-s-1, M) forwards to fill
  the pipeline, then alternates one forward and one backward, then drains the backwards; it
  keeps at most P-s micro-batches' inputs. The same bubble as GPipe, less memory.

Both flush at the end of every step (synchronous: the update is the whole batch's), so each
leaves (P-1)/(M+P-1) of a step idle on each stage when the stages cost the same (`bubble`).
Stages that cannot cost the same (a cut falls only between nodes) leave more: `simulate` runs a
schedule on given per-stage pass times with free messages, the best any implementation of it
could do with those stages.
"""

from __future__ import annotations

from collections.abc import Callable

Op = tuple[str, int]  # ("F" | "B", micro-batch)


def gpipe(stage: int, stages: int, micro: int) -> list[Op]:
    return [("F", i) for i in range(micro)] + [("B", i) for i in range(micro)]


def one_f_one_b(stage: int, stages: int, micro: int) -> list[Op]:
    warm = min(stages - stage - 1, micro)
    out: list[Op] = [("F", i) for i in range(warm)]
    forward = warm
    for backward in range(micro):
        if forward < micro:
            out.append(("F", forward))
            forward += 1
        out.append(("B", backward))
    return out


SCHEDULES: dict[str, Callable[[int, int, int], list[Op]]] = {"gpipe": gpipe, "1f1b": one_f_one_b}


def ops(name: str, stage: int, stages: int, micro: int) -> list[Op]:
    """Stage `stage`'s passes of one step under schedule `name`."""
    return SCHEDULES[name](stage, stages, micro)


def bubble(stages: int, micro: int) -> float:
    """The idle fraction of a step on a stage, in theory: (P-1)/(M+P-1)."""
    return (stages - 1) / (micro + stages - 1)


def stashed(name: str, stage: int, stages: int, micro: int) -> int:
    """The most micro-batches whose inputs stage `stage` holds at once under `name`."""
    held = peak = 0
    for kind, _ in ops(name, stage, stages, micro):
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def simulate(name: str, forward: list[float], backward: list[float], micro: int) -> list[float]:
    """Each stage's idle fraction of a step under schedule `name` when stage s's forward of a
    micro-batch takes forward[s] and its backward backward[s] (any unit), and messages take no
    time. The last stage runs a micro-batch's forward and backward at once at its forward's
    turn, as d500's pipeline does. The step ends with the last pass on any stage; equal stages
    give `bubble` on each."""
    stages = len(forward)
    last = stages - 1
    todo = [ops(name, s, stages, micro) for s in range(stages)]
    free, work = [0.0] * stages, [0.0] * stages
    done: dict[tuple[str, int, int], float] = {}  # (kind, stage, micro-batch) -> its end
    while any(todo):
        for s in range(stages):
            while todo[s]:
                kind, i = todo[s][0]
                need = (("F", s - 1, i) if s else None) if kind == "F" else \
                    (("F" if s + 1 == last else "B", s + 1, i) if s < last else None)
                if need is not None and need not in done:
                    break
                cost = (forward[s] + backward[s] if s == last else forward[s]) if kind == "F" \
                    else (0.0 if s == last else backward[s])
                free[s] = max(free[s], done.get(need, 0.0)) + cost
                work[s] += cost
                done[kind, s, i] = free[s]
                todo[s].pop(0)
    step = max(free)
    return [1.0 - w / step if step else 0.0 for w in work]
