"""Level 3's rules and launch: the level-3 workload schema, the entry's `distributed:` mapping, and
`d500 train` of a level-3 workload refused with one line and exit 2 on every rank, never a hang:
without MPI, at a world size the workload does not allow, with an unknown scheme, and when the
ranks disagree on the submission (real mpiexec jobs)."""

from __future__ import annotations

import time

import pytest
import yaml

from d500 import levels
from d500.distributed import spec, workloads
from d500.errors import ConfigError, UsageError
from d500.ledger import Ledger
from tests.distributed import level3_jobs as jobs

MLP = jobs.LEVEL3 / "digits-mlp.yaml"


def test_the_level_is_registered_and_loads_its_workloads():
    level = levels.get(3)
    assert level.name == "distributed" and "scale" in level.commands
    names = {p.stem for p in level.workload_files()}
    assert {"digits-mlp", "digits-lenet", "cifar10-resnet20"} <= names
    wl = level.load(MLP)
    assert wl.ranks == (1, 2, 4) and wl.batch_mode == "global" and wl.reference_ranks == 1
    assert wl.global_batch(32, 4) == 32 and wl.target == 0.97
    assert {"bytes_per_step", "comm_share", "scaling_efficiency"} <= set(wl.metrics)
    resnet = level.load(jobs.LEVEL3 / "cifar10-resnet20.yaml")
    assert resnet.batch_mode == "per_rank" and resnet.global_batch(128, 8) == 1024
    entries = {p.name for p in level.entries()}
    assert {"sync", "ps", "async-ps", "dpsgd", "local-sgd", "sync-topk", "sync-powersgd",
            "ddp-baseline"} <= entries


def test_world_size_and_global_batch_rules():
    wl = workloads.load(MLP)
    wl.check_world(2)
    with pytest.raises(ConfigError, match=r"runs at 1, 2, 4 rank\(s\) .*not at 3"):
        wl.check_world(3)
    wl.check_batch(32, 4, "entry")
    with pytest.raises(ConfigError, match="global batch 512 .* outside the limits"):
        wl.check_batch(512, 2, "entry")


@pytest.mark.parametrize("change, message", [
    ({"distributed": {"ranks": []}}, "'distributed.ranks' must list world sizes >= 1"),
    ({"distributed": {"ranks": [2, 2]}}, "lists a world size twice"),
    ({"distributed": {"batch": "sometimes"}}, "'distributed.batch' is 'sometimes'"),
    ({"distributed": {"ranks": [2], "hosts": 3}}, "unknown field 'distributed.hosts'"),
    ({"distributed": None}, "missing required field 'distributed'"),
    ({"metrics": ["time_to_accuracy", "latency"]}, "names 'latency', which level 3 does not"),
    ({"tuning": {"studies": 1, "trials": 1, "seed": 0}},
     (r"^\S+digits-mlp.yaml: field 'tuning' is not allowed at level 3 \(`d500 tune` tunes "
      r"level-2 workloads; level 3 is scored on seed runs at each world size\)$")),
])
def test_bad_workload_fields_name_the_field(tmp_path, change, message):
    path = jobs.workload(tmp_path, "digits-mlp", **change)
    if change.get("distributed", 1) is None:
        data = yaml.safe_load(path.read_text())
        data.pop("distributed")
        path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=message):
        workloads.load(path)


def test_level3_workloads_have_no_tuning_and_d500_tune_refuses_them(tmp_path):
    """No level-3 rulebook file declares `tuning:` (nothing tunes level 3); `d500 tune` of one is
    one line and exit 2 before anything runs, while its level-2 namesake is tuned."""
    for path in levels.get(3).workload_files():
        assert "tuning" not in yaml.safe_load(path.read_text()), path
        wl = workloads.load(path)
        assert (wl.tuned, wl.studies, wl.trials) == (False, 0, 0), path
    level2 = levels.get(2).load(levels.get(2).find("digits-mlp"))
    assert (level2.tuned, level2.studies, level2.trials) == (True, 3, 5)
    home = tmp_path / "home"
    result = jobs.plain_d500(home, "tune", str(MLP), "--submission", str(jobs.ENTRIES / "sync"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        (f"d500 tune: error: {MLP}: 'digits-mlp' is a level-3 workload, which has no tuning "
         f"(`d500 tune` tunes level 2; run its seeds with mpiexec -n N d500 train)")]
    assert not (home / "ledger.sqlite").exists()


def test_every_level3_entry_runs_at_its_world_size_on_each_of_its_workloads():
    """An entry that fixes its dimensions (data x pipeline x tensor) lists only workloads whose
    `distributed.ranks` allow that world size (hybrid-data-pipeline listed digits-lenet, which
    runs at 1 or 2 ranks, and every rank exited 2 at 4)."""
    entries = [yaml.safe_load(f.read_text()) | {"where": f}
               for f in sorted(jobs.ENTRIES.glob("*/submission.yaml"))]
    checked = 0
    for e in (e for e in entries if e.get("level") == 3):
        s = spec.parse(e.get("distributed"), e["where"])
        world = (s.data or 1) * s.pipeline * s.tensor
        for name in e["workloads"]:
            allowed = yaml.safe_load((jobs.LEVEL3 / f"{name}.yaml").read_text())[
                "distributed"]["ranks"]
            assert world in allowed, f"{e['where']}: {name} allows {allowed}, not {world}"
            checked += 1
    assert checked > 20


def test_the_distributed_mapping_of_an_entry():
    s = spec.parse({"scheme": "sync", "compression": {"name": "topk", "density": 0.01},
                    "bucket_mb": 1}, "e.yaml")
    assert (s.scheme, s.compressor, s.compression, s.bucket_bytes) == (
        "sync", "topk", {"density": 0.01}, 2**20)
    assert s.logged()["compressor_density"] == 0.01 and s.comm_precision == "fp32"
    assert spec.parse({"scheme": "sync", "compression": "fp16"}, "e").comm_precision == "fp16"
    assert spec.parse({"scheme": "ddp"}, "e").native
    with pytest.raises(UsageError, match=r"e.yaml: .*unknown scheme 'allreduce' \(known: "
                                         r"async_ps, dpsgd, local_sgd, ps, ssp, sync, ddp, fsdp, "
                                         r"dtensor, pipelining\)"):
        spec.parse({"scheme": "allreduce"}, "e.yaml")
    with pytest.raises(ConfigError, match="the ddp baseline runs torch's own collectives"):
        spec.parse({"scheme": "ddp", "compression": {"name": "fp16"}}, "e.yaml")
    with pytest.raises(UsageError, match="unknown compressor 'zip'"):
        spec.parse({"scheme": "sync", "compression": {"name": "zip"}}, "e.yaml")
    with pytest.raises(ConfigError, match="'distributed.bucket_mb' must be a positive number"):
        spec.parse({"scheme": "sync", "bucket_mb": 0}, "e.yaml")
    with pytest.raises(ConfigError, match="unknown field 'distributed.ranks'"):
        spec.parse({"scheme": "sync", "ranks": 2}, "e.yaml")
    with pytest.raises(ConfigError, match="needs a 'distributed' mapping"):
        spec.parse({}, "e.yaml")


def test_without_mpi_a_level3_workload_is_one_line_and_exit_2(tmp_path):
    home = tmp_path / "home"
    result = jobs.plain_d500(home, "train", str(MLP), "--submission",
                             str(jobs.ENTRIES / "sync"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a level-3 (distributed) workload: run it under MPI" in lines[0]
    assert not (home / "ledger.sqlite").exists()
    # the example's rank count fits this machine's cores (digits-mlp allows 1, 2 or 4 ranks),
    # or the line says that it oversubscribes them
    import re

    from d500.provenance import usable_cores
    n = int(re.search(r"mpiexec -n (\d+)", lines[0]).group(1))
    assert n in (2, 4) and (n <= usable_cores() or "oversubscribe" in lines[0])
    assert n == (4 if usable_cores() >= 4 else 2)


pytestmark_mpi = pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")


def _refused(result, ranks: int, message: str, home) -> None:
    assert result.returncode == 2, result.stderr
    # one line per rank (hydra forwards the ranks' stderr concurrently: lines come in any order)
    assert result.stderr.count(message) == ranks, result.stderr
    assert result.stderr.count("d500 train: error: ") == ranks, result.stderr
    lines = result.stderr.splitlines()  # each whole, on its own line, named by its rank
    assert sorted(line.split("] ", 1)[0] + "]" for line in lines) == [
        f"[rank {r}]" for r in range(ranks)], result.stderr
    assert "Traceback" not in result.stderr and result.stdout.strip() == ""
    assert not (home / "ledger.sqlite").exists() or Ledger(home / "ledger.sqlite").runs() == []


@pytestmark_mpi
@pytest.mark.mpi
def test_a_world_size_the_workload_does_not_allow_exits_2_on_every_rank(tmp_path):
    home = tmp_path / "home"
    t0 = time.perf_counter()
    result = jobs.train(home, 3, MLP, jobs.ENTRIES / "sync", timeout=120)
    _refused(result, 3, "runs at 1, 2, 4 rank(s) (field 'distributed.ranks'), not at 3", home)
    assert time.perf_counter() - t0 < 120


@pytestmark_mpi
@pytest.mark.mpi
def test_an_unknown_scheme_exits_2_on_every_rank(tmp_path):
    home = tmp_path / "home"
    folder = jobs.entry(tmp_path, "sync", distributed={"scheme": "allreduce"})
    result = jobs.train(home, 2, MLP, folder, timeout=120)
    _refused(result, 2, "unknown scheme 'allreduce' (known: async_ps, dpsgd, local_sgd, ps, "
                        "ssp, sync, ddp, fsdp, dtensor, pipelining)", home)


@pytestmark_mpi
@pytest.mark.mpi
def test_ranks_that_disagree_on_the_submission_exit_2_on_every_rank(tmp_path):
    """Rank 0 and rank 1 run the same command line in two folders whose `entry/` differ by one
    hyperparameter: the digest comparison names what differs and which ranks."""
    home = tmp_path / "home"
    a, b = tmp_path / "a", tmp_path / "b"
    jobs.entry(a, "sync", folder="entry")
    jobs.entry(b, "sync", folder="entry", hyperparameters={"lr": 0.1})
    argv = ["train", str(MLP), "--submission", "entry"]
    python = [jobs.sys.executable, "-m", "d500.cli", *argv]
    command = [str(jobs.MPIEXEC), "-n", "1", "-wdir", str(a), *python, ":", "-n", "1", "-wdir",
               str(b), *python]
    result = jobs.subprocess.run(command, env=jobs.environment(home), capture_output=True,
                                 text=True, timeout=120, check=False)
    _refused(result, 2, "the ranks disagree on the submission folder (rank(s) 0: ", home)
    assert "rank(s) 1: " in result.stderr
