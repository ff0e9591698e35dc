"""The torch-native model-parallel baselines on two real MPI ranks: the checks of
mpi_baseline_checks.py in one `mpiexec -n 2` job, each reported here as its own test; then the
DTensor baseline under the judge with ranks that forge their memory claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import level3_jobs as jobs

from .mpi_jobs import CheckJob

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")]

JOB = CheckJob(Path(__file__).with_name("mpi_baseline_checks.py"))


@pytest.mark.parametrize("name", JOB.names)
def test_on_two_ranks(name):
    JOB.passed(name, 2)


# An entry's optimizer file that, on import in every rank, makes the DTensor baseline claim half
# the parameter bytes it holds (a smaller memory per rank on the board).
FORGED = '''
from d500.distributed import dtensor as _dtensor
from d500.training.optimizers import Optimizer

_memory = _dtensor.DTensorScheme.memory


def _half(self):
    return {k: v / 2 for k, v in _memory(self).items()}


_dtensor.DTensorScheme.memory = _half


class Sgd(Optimizer):
    name = "forged-sgd"

    def update(self, ops, params, grads, state, lr, t):
        ops.add_(params, grads, -lr)
'''


@pytest.mark.slow
def test_the_dtensor_baseline_under_the_judge_and_a_forged_memory_claim(tmp_path):
    """tp-baseline's ranks hand the judge the whole model (full_tensor), which audits the loss
    after each hand-over; ranks claiming half the bytes they hold get no memory_per_rank (the
    judge's own split says what a tensor rank holds), their bytes and accuracy stay recorded."""
    entry = jobs.entry(tmp_path, "tp-baseline", folder="forged", files={"forged.py": FORGED},
                       name="forged", optimizer="forged.py:Sgd", hyperparameters={"lr": 0.1})
    # rank 0 went silent for the watchdog's default 10 s in 2 of 4 whole quiet make tests
    # (2026-11-28: rank 1 left waiting for its command, the job aborted, exit 9), never alone or
    # in its file, cause not found (the lead's closing note): 60 s here, so that a stall that
    # passes is told from one that does not; the lines saying why come first in the failure
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 2})
    out = jobs.train(home, 2, wl, entry, "--seed", "0",
                     env=jobs.environment(home, D500_MPI_TIMEOUT="60"))
    why = [line for line in out.stderr.splitlines() if "error" in line.lower()][:5]
    assert out.returncode in (0, 1), ("\n".join(why), out.stderr[-2000:])
    run = jobs.last_run(home)
    assert run["status"] in ("succeeded", "missed"), run["error"]
    assert run["details"]["audited_steps"] >= 1  # the handed model gives the ranks' losses
    assert run["details"]["scheme_details"]["tensor_split"]["ways"] == 2
    assert run["details"]["ranks"][0]["scheme"]["param_bytes"] == 35880 / 2  # the claim
    assert "memory_per_rank" not in run["figures"], run["figures"]  # not believed
    assert run["figures"]["bytes_per_step"] == 32 * 64 * 4  # fc2's partial output
