"""At level 3 the reproduction's result file is written by rank 0, a process the entry's code runs
in: on a real `mpiexec -n 2` reproduction, an optimizer whose atexit hook rewrites that file
(other epochs and steps, as it would to match figures forged in its package) changes nothing
`d500 reproduce` compares: the status and figures are read from the run the judge sealed
(d500.competition.reproduce.sealed), and a result naming a run the reproduction did not make
is a failed reproduction."""

from __future__ import annotations

import json

import pytest

from d500.competition import reproduce as rp
from d500.competition.export import build
from d500.competition.package import Package
from tests.distributed import level3_jobs as jobs

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

# Plain SGD; in a reproduction's job (python -m d500.competition.reproduce_job JOB.json), its
# hook rewrites the result file rank 0 wrote, after d500 wrote it.
HOOK = '''
import atexit, json, sys
from d500.training.optimizers import Optimizer


def _rewrite():
    job = json.loads(open(sys.argv[-1]).read())
    found = json.loads(open(job["out"]).read())
    found["figures"] = {**found["figures"], "epochs": 0.5, "steps": 1.0}
    open(job["out"], "w").write(json.dumps(found))


if "reproduce_job" in sys.argv[0]:
    atexit.register(_rewrite)


class Plain(Optimizer):
    name = "plain"

    def update(self, ops, params, grads, state, lr, t):
        ops.add_(params, grads, -lr)
'''


def test_rank_0_rewriting_its_result_file_changes_nothing_reproduce_compares(tmp_path):
    rules, home = tmp_path / "rules", tmp_path / "entrant"
    (rules / "3-distributed").mkdir(parents=True)
    wl = jobs.workload(rules / "3-distributed", "digits-mlp", budget={"max_epochs": 2})
    entry = jobs.entry(tmp_path, "sync", folder="hook", files={"opt.py": HOOK}, name="hook",
                       optimizer="opt.py:Plain", hyperparameters={"lr": 0.1}, search_space={},
                       feasible_points=[])
    out = jobs.train(home, 2, wl, entry, "--seed", "0")
    assert out.returncode in (0, 1), out.stderr
    package = Package.open(build(entry, tmp_path / "hook.tar.gz", home / "ledger.sqlite"))
    [origin] = [r for r in package.runs() if r.rank in (None, 0)]
    ledger = tmp_path / "organiser" / "ledger.sqlite"
    [run] = rp.reproduce(package, runs=1, seed=0, ledger=ledger, rules_dir=rules).runs
    # every check but the two timings agrees; those depend on the load beside the reproduction:
    # judged where it left the job's 2 ranks nearly 2 cores, else inconclusive, never an honest
    # run accused (the rule judged the rehearsal's 'disagrees' at 1.8x, its ranks at 4x slower)
    times = ("time_to_accuracy", "evaluation times")
    assert all(c.agrees for c in run.checks if c.name not in times), run
    assert run.verdict in ("agrees", "inconclusive"), run
    by = {c.name: c for c in run.checks}
    assert by["epochs"].reproduced == origin.figures["epochs"] != 0.5
    assert by["steps"].reproduced == origin.figures["steps"]
    # the hook did rewrite the file: d500 read the sealed run instead
    jobs_dir = ledger.parent / "reproduce" / package.sha256[:12] / "jobs"
    written = json.loads((jobs_dir / f"run-{origin.origin_id}.result.json").read_text())
    assert written["figures"]["epochs"] == 0.5


def test_a_result_naming_a_run_the_reproduction_did_not_make_fails(tmp_path):
    from d500.ledger import Ledger
    ledger = tmp_path / "ledger.sqlite"
    book = Ledger(ledger)
    with book.start_run(level=2, workload="w", submission="s", backend="torch", seed=0) as run:
        run.record(figures={"epochs": 1.0}, details={"reproduction": {"origin_run": 1}})
    stamp = {"reproduction": {"origin_run": 1}}
    named = {"run_id": run.id, "status": "succeeded", "figures": {"epochs": 9.0}}
    assert rp.sealed(named, ledger, stamp, 0, 2)["figures"] == {"epochs": 1.0}
    for before, details in ((run.id, stamp), (0, {"reproduction": {"origin_run": 2}})):
        got = rp.sealed(named, ledger, details, before, 3)
        assert got["status"] == "failed" and got["run_id"] is None
        assert f"named run {run.id}, not a run it made" in got["error"]
