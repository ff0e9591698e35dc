"""Pipeline parallelism (issue 20 item 2) on real `mpiexec -n 2` ranks: the checks of
mpi_pipeline_checks.py (GPipe and 1F1B equal one process within 1e-5 after 20 steps of the digits
MLP and LeNet-5, unequal micro-batches, 1F1B's smaller stash), each its own test, and all of
them again at 4 ranks as data 2 x pipeline 2; then
`d500 train` of the pipeline entries under the judge: the cut is recorded, the bubble beside its
theory, memory per rank from the judge's own cut, its MLLOG consistent with its record; and the
attack: an entry whose stages train on half of each batch is recorded failed by the judge's
audit."""

from __future__ import annotations

from pathlib import Path

import pytest

from d500.competition.check import check
from d500.competition.export import build
from d500.competition.package import Package
from tests.distributed import level3_jobs as jobs
from tests.distributed.mpi_jobs import CheckJob

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

JOB = CheckJob(Path(__file__).with_name("mpi_pipeline_checks.py"))

# An entry's optimizer file that, on import in every rank, makes the pipeline's stages run only
# the first half of each batch's micro-batches (the loss and gradient a half batch's mean, so
# they look like a whole batch's), and so finish each step sooner.
HALF = '''
from d500.distributed.pipeline import scheme as _pipeline
from d500.training.optimizers import Optimizer

_step = _pipeline.Pipeline.step


def _half(self, feeds, lr, weight=1.0):
    n = len(next(iter(feeds.values())))
    return _step(self, {k: v[: n // 2] for k, v in feeds.items()}, lr, weight)


_pipeline.Pipeline.step = _half


class Sgd(Optimizer):
    name = "half-sgd"

    def update(self, ops, params, grads, state, lr, t):
        ops.add_(params, grads, -lr)
'''


@pytest.mark.parametrize("name", JOB.names)
def test_on_two_ranks(name):
    JOB.passed(name, 2)


def test_data_and_pipeline_compose_at_four_ranks():
    """{data: 2, pipeline: 2}: each stage's gradients averaged over its data pair; the same
    checks (one job of 4 ranks, oversubscribing a 2-core machine: ~20 s)."""
    for name in JOB.names:
        JOB.passed(name, 4)


def test_a_pipeline_entry_trains_under_the_judge_and_records_its_cut(tmp_path):
    home, wl = tmp_path / "home", tmp_path / "digits-mlp.yaml"
    out, run = jobs.judged(tmp_path, jobs.ENTRIES / "pipeline-1f1b")
    assert out.returncode in (0, 1), out.stderr[-2000:]
    assert run["status"] in ("succeeded", "missed"), run["error"]
    details, figures = run["details"], run["figures"]
    cut = details["scheme_details"]["partition"]["stages"]
    assert [s["stage"] for s in cut] == [0, 1] and cut[0]["sends"] == ["relu1"]
    assert details["audited_steps"] >= 1  # the judge recomputed a step's loss and agreed
    assert figures["bubble_theory"] == pytest.approx(1 / 5)  # P = 2, M = 4
    assert 0 < figures["bubble_fraction"] < 1
    # memory: each rank its own stage's parameters, as the judge's own cut says
    params = [r["scheme"]["param_bytes"] for r in details["ranks"]]
    held = [sum(r["scheme"][k] for k in ("param_bytes", "grad_bytes", "optimizer_bytes"))
            for r in details["ranks"]]
    assert params[0] != params[1] and figures["memory_per_rank"] == max(held)
    assert run["hyperparameters"]["per_rank_batch_size"] == 32  # both stages see the batch
    # its MLLOG (micro batch 32, data_parallelism 1) agrees with its record
    package = build(jobs.ENTRIES / "pipeline-1f1b", tmp_path / "p.tar.gz", home / "ledger.sqlite")
    problems = check(Package.open(package)).problems
    assert not [p for p in problems if p.startswith("consistency:")], problems
    shown = jobs.plain_d500(home, "train", str(wl), "--submission",
                            str(jobs.ENTRIES / "pipeline-1f1b"), "--show-partition")
    assert shown.returncode == 0, shown.stderr
    assert "relu1 (512 B/sample)" in shown.stdout and "imbalance" in shown.stdout
    flat = jobs.plain_d500(home, "train", str(wl), "--submission", str(jobs.ENTRIES / "sync"),
                           "--show-partition")
    assert flat.returncode == 2 and len(flat.stderr.strip().splitlines()) == 1, flat.stderr
    assert "'distributed.pipeline' is 1: there is no cut to show" in flat.stderr


def test_stages_that_skip_half_their_micro_batches_are_caught_by_the_judge(tmp_path):
    run = jobs.caught(tmp_path, "pipeline-gpipe", "half", HALF)
    assert "every sample" in run["error"], run["error"]
