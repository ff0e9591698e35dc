"""The alpha-beta scaling model: its per-collective times against the written-out formulas, buffer
sizes read back from the communicator's own byte counts, the scheme rules (D-PSGD's neighbours
from 3 ranks, the asynchronous server's bottleneck), strong and weak efficiency, `d500 scale`'s
refusals; and (MPI) its 2-rank prediction against the step time measured on this machine."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest

from d500.distributed import scaling
from d500.distributed.comm import chain_counts, gather_counts, ring_counts
from d500.distributed.network import Network
from d500.errors import UsageError
from tests.distributed import level3_jobs as jobs

NET = Network(alpha=2e-6, beta=1 / 12.5e9)


def run_record(scheme: str, n0: int, per_rank: list[dict], compute: float = 1e-3,
               step: float = 2e-3, batch: int = 64, mode: str = "global",
               compressor: str = "none") -> dict:
    """A level-3 ledger run as Ledger.get returns it (the fields the model reads)."""
    ranks = [{"rank": r, "step_time": step, "step_time_median": step,
              "compute_time_per_step": compute, "compute_time_median": compute,
              "collectives": c} for r, c in enumerate(per_rank)]
    return {"id": 7, "level": 3, "world_size": n0,
            "hyperparameters": {"scheme": scheme, "compressor": compressor, "batch_size": batch},
            "details": {"ranks": ranks, "global_batch": batch, "batch_mode": mode}}


def test_call_times_are_the_written_out_formulas():
    a, b, n, size = NET.alpha, NET.beta, 64, 4e6
    assert scaling.call_time("allreduce", size, n, NET) == pytest.approx(
        2 * 63 * a + 2 * 63 / 64 * size * b)
    assert scaling.call_time("allgather", size, n, NET) == pytest.approx(63 * a + 63 * size * b)
    assert scaling.call_time("tree", size, n, NET) == pytest.approx(
        (6 + 63) * a + 2 * 63 / 64 * size * b)
    assert scaling.call_time("neighbour", size, n, NET) == pytest.approx(2 * a + 2 * size * b)
    assert scaling.call_time("p2p", size, n, NET) == pytest.approx(a + size * b)
    assert scaling.call_time("allreduce", size, 1, NET) == 0.0


@pytest.mark.parametrize("n0", [2, 3, 4])
def test_buffer_sizes_come_back_from_the_communicators_counts(n0):
    """Counts made with comm.py's own formulas (a 68,904-byte model) give the buffer back."""
    elements, nbytes = 17226, 17226 * 4
    per_rank = []
    for r in range(n0):
        sent, received = ring_counts(elements, n0, r)
        gs, gr = gather_counts([1400] * n0, r)
        bs, br = chain_counts(nbytes, n0, r, 0)
        per_rank.append({"allreduce": {"calls": 2, "sent": 2 * 4 * sent,
                                       "received": 2 * 4 * received, "seconds": 0.0},
                         "allgather": {"calls": 1, "sent": gs, "received": gr, "seconds": 0.0},
                         "broadcast": {"calls": 1, "sent": bs, "received": br, "seconds": 0.0}})
    profile = scaling.Profile.from_run(run_record("sync", n0, per_rank))
    got = {c.name: c for c in profile.collectives}
    assert got["allreduce"].calls == 2
    assert got["allreduce"].nbytes == pytest.approx(nbytes, rel=2e-4)  # ring chunks: +-2 elements
    assert got["allgather"].nbytes == 1400 and got["broadcast"].nbytes == nbytes


@pytest.mark.parametrize("n0", [2, 3])
def test_zero_blocks_read_back_the_whole_model_and_scale_as_ring_halves(n0):
    """ZeRO's reduce-scatter and allgatherv of uneven whole-tensor blocks (comm.py's counts)
    give the model's bytes back; a call at N ranks costs (N-1) alpha + (N-1)/N B beta."""
    blocks = [40000, 28904] if n0 == 2 else [30000, 20000, 18904]
    b = sum(blocks)
    per_rank = []
    for r in range(n0):
        gs, gr = gather_counts(blocks, r)
        rs, rr = b - blocks[r], b - blocks[(r + 1) % n0]
        per_rank.append({"allgatherv": {"calls": 1, "sent": gs, "received": gr, "seconds": 0},
                         "reduce_scatter": {"calls": 1, "sent": rs, "received": rr,
                                            "seconds": 0}})
    record = run_record("sync", n0, per_rank)
    record["hyperparameters"]["shard"] = "zero2"
    profile = scaling.Profile.from_run(record)
    assert profile.label == "sync / zero2"
    assert {c.name: c.nbytes for c in profile.collectives} == {"allgatherv": b,
                                                               "reduce_scatter": b}
    assert scaling.call_time("blocks", b, 64, NET) == pytest.approx(
        63 * NET.alpha + 63 / 64 * b * NET.beta)
    ssp = scaling.Profile("ssp", "ssp", "none", 2, 1e-3, 2e-3, 64, "per_rank",
                          (scaling.Collective("ps_push", 1, b),
                           scaling.Collective("ps_pull", 1, b)))
    one = 2 * scaling.call_time("p2p", b, 64, NET)
    assert scaling.step_time(ssp, 64, NET) == pytest.approx(max(1e-3 + one, 63 * one))


@pytest.mark.parametrize("stage", ["zero1", "zero2", "zero3"])
def test_zero_memory_per_rank_cuts_what_each_stage_shards(stage):
    """At the measured world size the model gives the ranks' measured bytes back (evenly cut, so
    between the ranks' uneven blocks); at N ranks the stage's sharded states are cut N ways and
    the rest stays whole: ZeRO-1 the optimizer state, ZeRO-2 the gradients too, ZeRO-3 the
    parameters as well."""
    blocks, whole = [40000, 28904], 68904
    held = []
    for block in blocks:
        held.append({"param_bytes": block if stage == "zero3" else whole,
                     "grad_bytes": whole if stage == "zero1" else block,
                     "optimizer_bytes": 2 * block})  # momentum and a second moment
    record = run_record("sync", 2, [{}, {}])
    record["hyperparameters"]["shard"] = stage
    for rank, h in zip(record["details"]["ranks"], held):
        rank["scheme"] = h
    profile = scaling.Profile.from_run(record)
    assert profile.shard == stage and profile.label == f"sync / {stage}"
    totals = [sum(h.values()) for h in held]  # the model cuts evenly; the blocks were uneven
    assert min(totals) < scaling.memory(profile, 2) < max(totals)
    cut = {"zero1": 2 * whole, "zero2": 3 * whole, "zero3": 4 * whole}[stage]
    assert scaling.memory(profile, 64) == pytest.approx(4 * whole - cut + cut / 64)
    if stage == "zero3":  # inside a step it holds its rows and the layer gathered: 30,000 B
        for rank, block in zip(record["details"]["ranks"], blocks):
            rank["scheme"]["peak_param_bytes"] = block + 30000
        peaked = scaling.Profile.from_run(record)
        assert scaling.memory(peaked, 64) == pytest.approx(scaling.memory(profile, 64) + 30000)
    unsharded = scaling.Profile.from_run(run_record("sync", 2, [{}, {}]))
    assert unsharded.shard == "none" and scaling.memory(unsharded, 64) == unsharded.memory


def test_scheme_rules_and_efficiency():
    model = 4e6
    sync = scaling.Profile("sync", "sync", "none", 2, 1e-3, 2e-3, 64, "global",
                           (scaling.Collective("allreduce", 1, model),))
    # strong scaling: compute shrinks with the per-rank batch, communication does not
    t8 = scaling.step_time(sync, 8, NET)
    assert t8 == pytest.approx(1e-3 * 2 / 8 + scaling.call_time("allreduce", model, 8, NET))
    assert scaling.efficiency(sync, 8, NET) == pytest.approx(
        scaling.step_time(sync, 1, NET) / (8 * t8))
    assert scaling.step_time(sync, 128, NET) is None  # 64 samples cannot feed 128 ranks
    weak = scaling.efficiency(sync, 128, NET, weak=True)
    assert weak == pytest.approx(1e-3 / (1e-3 + scaling.call_time("allreduce", model, 128, NET)))
    free = scaling.Profile("x", "sync", "none", 2, 1e-3, 1e-3, 64, "per_rank", ())
    assert scaling.efficiency(free, 1024, NET) == pytest.approx(1.0)
    # D-PSGD: an allreduce of the model at 2 ranks, both ring neighbours from 3 on
    dpsgd = scaling.Profile("dpsgd", "dpsgd", "none", 2, 1e-3, 2e-3, 64, "per_rank",
                            (scaling.Collective("allreduce", 1, model),))
    assert scaling.comm_time(dpsgd, 2, NET) == scaling.call_time("allreduce", model, 2, NET)
    assert scaling.comm_time(dpsgd, 512, NET) == scaling.call_time("neighbour", model, 512, NET)
    # the asynchronous server takes every worker's push and pull
    aps = scaling.Profile("async_ps", "async_ps", "none", 2, 1e-3, 2e-3, 64, "per_rank",
                          (scaling.Collective("ps_push", 1, model),
                           scaling.Collective("ps_pull", 1, model)))
    one = 2 * scaling.call_time("p2p", model, 64, NET)
    assert scaling.step_time(aps, 64, NET) == pytest.approx(max(1e-3 + one, 63 * one))


def test_an_allgathered_compressor_stops_paying_at_scale():
    """A 100 MB model: top-k at 1% sends 2 MB (values + indices) per rank, allgathered, against
    the dense ring allreduce's ~2 x 100 MB: (N-1) x 2 MB wins at 8 ranks and loses at 1,024, the
    answer to "is it worth compressing on my cluster?" the model exists to give."""
    dense = scaling.Profile("sync", "sync", "none", 2, 0.1, 0, 64, "per_rank",
                            (scaling.Collective("allreduce", 1, 100e6),))
    topk = scaling.Profile("sync / topk", "sync", "topk", 2, 0.1, 0, 64, "per_rank",
                           (scaling.Collective("allgather", 1, 2e6),))
    assert scaling.step_time(topk, 8, NET) < scaling.step_time(dense, 8, NET)
    assert scaling.step_time(topk, 1024, NET) > scaling.step_time(dense, 1024, NET)
    rows = scaling.predict([dense, topk], NET)
    assert [r.ranks for r in rows] == list(scaling.SIZES) * 2
    png = scaling.plot(rows, NET)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_one_rank_run_or_another_level_cannot_be_modelled():
    with pytest.raises(UsageError, match="ran on 1 rank"):
        scaling.Profile.from_run(run_record("sync", 1, [{}]))
    with pytest.raises(UsageError, match=r"not a level-3 run .*\(it is a .* level-2 run of "):
        scaling.Profile.from_run({**run_record("sync", 2, [{}, {}]), "level": 2})


def test_scale_cli_refusals(tmp_path):
    from d500.ledger import Ledger
    home = tmp_path / "home"
    Ledger(home / "ledger.sqlite").close()  # one without level-3 runs (scale only reads)
    result = jobs.plain_d500(home, "scale", "digits-mlp", "--network", "2us,12.5GB/s")
    assert result.returncode == 2 and "no succeeded level-3 run of 'digits-mlp'" in result.stderr
    typo = jobs.plain_d500(home, "scale", "digits-mpl", "--network", "2us,12.5GB/s")
    assert typo.returncode == 2 and "no level-3 workload named 'digits-mpl'" in typo.stderr
    assert "did you mean 'digits-mlp'?" in typo.stderr
    bad = jobs.plain_d500(home, "scale", "3", "--network", "fast")
    assert bad.returncode == 2 and "--network 'fast'" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_scale_reads_the_ledger_named_by_its_ledger_option(tmp_path):
    """`d500 scale RUN --ledger FILE` models a run of that file, as `d500 ledger --ledger FILE`
    and `d500 leaderboard --ledger FILE` read it (it had no --ledger: only $D500_HOME's); a
    missing file is one line, exit 2, before the network is measured."""
    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    run_id = str(recorded_sync_run(elsewhere))
    there = jobs.plain_d500(home, "scale", run_id, "--network", "2us,12.5GB/s", "--ledger",
                            str(elsewhere / "ledger.sqlite"), "--json")
    assert there.returncode == 0, there.stderr
    assert json.loads(there.stdout)["profiles"][0]["run_id"] == int(run_id)
    missing = jobs.plain_d500(home, "scale", run_id, "--ledger", str(tmp_path / "nope.sqlite"))
    assert missing.returncode == 2
    assert missing.stderr == f"d500 scale: error: --ledger {tmp_path / 'nope.sqlite'}: no such " \
                             f"ledger file\n"
    if jobs.MPIEXEC is not None:  # a home without a ledger under mpiexec: refused by every rank
        nowhere = subprocess.run(  # before the ranks' network sweep (it measured, then refused)
            [jobs.MPIEXEC, "-n", "2", sys.executable, "-m", "d500.cli", "scale", run_id],
            env=jobs.environment(tmp_path / "no-home"), cwd=tmp_path, capture_output=True,
            text=True, timeout=120, check=False)
        assert nowhere.returncode != 0 and "no ledger at " in nowhere.stderr, nowhere.stderr
        assert "measuring this machine's network" not in nowhere.stderr, nowhere.stderr


@pytest.mark.slow  # the sweep: ~15 s at load 12
@pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")
def test_scale_says_it_measures_the_network_before_it_does(tmp_path):
    """Without --network, `d500 scale` measures this machine's MPI (mpiexec -n 2, a ping-pong
    sweep): one line on stderr says so first (the sweep took ~15 s here and said nothing)."""
    home = tmp_path / "home"
    run_id = str(recorded_sync_run(home))
    out = jobs.plain_d500(home, "scale", run_id, "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "d500 scale: measuring this machine's network (a ping-pong sweep between 2 MPI ranks; "
        "--network LATENCY,BANDWIDTH gives a cluster's instead) ..."]
    assert json.loads(out.stdout)["network"]["source"] == "ping-pong"


def recorded_sync_run(home) -> int:
    """A succeeded 2-rank sync run at a global batch of 32 in the ledger under `home`, as the
    level-3 trainer records it (per-rank figures in its details)."""
    from d500.ledger import Ledger
    per_rank = [{"allreduce": {"calls": 1, "sent": 4e6, "received": 4e6, "seconds": 0.0}}] * 2
    record = run_record("sync", 2, per_rank, batch=32)
    run = Ledger(home / "ledger.sqlite").start_run(
        level=3, workload="w3", submission="sync", backend="torch", rank=0, world_size=2,
        hyperparameters=record["hyperparameters"])
    run.finish("succeeded", details=record["details"])
    return run.id


def test_scale_says_why_a_world_size_has_no_prediction_and_weak_keeps_its_own_plot(tmp_path):
    """Issue 22 item 5: the "—" at 64 ... 1,024 ranks comes with its reason under the table (and
    on the plot, whose axis keeps those sizes); --weak, which has them all, writes its own PNG
    beside the strong-scaling one instead of over it."""
    home = tmp_path / "home"
    run_id = str(recorded_sync_run(home))
    strong = jobs.plain_d500(home, "scale", run_id, "--network", "2us,12.5GB/s")
    assert strong.returncode == 0, strong.stderr
    note = next(line for line in strong.stdout.splitlines() if "no prediction at" in line)
    assert "64, 128, 256, 512 and 1,024 ranks" in note
    assert "global batch of 32 samples is smaller than the rank count" in note
    assert note.endswith("--weak keeps the per-rank batch)"), note  # whole: it broke at 160
    assert "8, 16" not in note
    weak = jobs.plain_d500(home, "scale", run_id, "--network", "2us,12.5GB/s", "--weak")
    assert weak.returncode == 0, weak.stderr
    assert "no prediction" not in weak.stdout and "—" not in weak.stdout
    strong_png, weak_png = home / f"scale-{run_id}.png", home / f"scale-{run_id}-weak.png"
    assert f"plot: {strong_png}" in strong.stdout.splitlines()
    assert f"plot: {weak_png}" in weak.stdout.splitlines()
    assert strong_png.read_bytes()[:4] == weak_png.read_bytes()[:4] == b"\x89PNG"
    assert strong_png.read_bytes() != weak_png.read_bytes()
    report = json.loads(jobs.plain_d500(home, "scale", run_id, "--network", "2us,12.5GB/s",
                                        "--json").stdout)
    reasons = {p["ranks"]: p["not_possible"] for p in report["predictions"]}
    assert reasons[32] is None and "smaller than the rank count" in reasons[64]


def test_the_plot_notes_the_world_sizes_it_leaves_out():
    sync = scaling.Profile("sync", "sync", "none", 2, 1e-3, 2e-3, 32, "global",
                           (scaling.Collective("allreduce", 1, 4e6),))
    rows = scaling.predict([sync], NET)
    assert scaling.left_out(rows) == [
        "sync: no prediction at 64, 128, 256, 512 and 1,024 ranks: the global batch of 32 "
        "samples is smaller than the rank count (strong scaling gives every rank a share of it; "
        "--weak keeps the per-rank batch)"]
    assert scaling.left_out(scaling.predict([sync], NET, weak=True)) == []
    texts = []
    import matplotlib.figure
    original = matplotlib.figure.Figure.text

    def spy(fig, x, y, s, *args, **kwargs):
        texts.append(s)
        return original(fig, x, y, s, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.Figure, "text", spy)
        assert scaling.plot(rows, NET)[:4] == b"\x89PNG"
    assert any("no prediction at 64" in t for t in texts)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")
def test_the_2_rank_prediction_holds_against_the_measured_step_time(tmp_path):
    """sync on digits-lenet at 2 ranks, then `d500 scale RUN --ranks 2` with alpha and beta
    measured here (a ping-pong between two ranks): predicted and measured median step within
    25%. On a machine other processes keep busy the ranks share cores with them and wait for
    each other, which no network model describes: then (the run's contention record says other
    processes took more than a tenth of the cores) the comparison is reported, not asserted."""
    home = tmp_path / "home"
    run = jobs.train(home, 2, jobs.LEVEL3 / "digits-lenet.yaml", jobs.ENTRIES / "sync",
                     "--seed", "0")
    assert run.returncode == 0, run.stderr[-2000:]
    run_id = json.loads(run.stdout)[0]["run_id"]
    png = tmp_path / "scale.png"
    out = jobs.plain_d500(home, "scale", str(run_id), "--ranks", "2,8,64,1024", "--json",
                          "--png", str(png), timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["network"]["source"] == "ping-pong" and png.read_bytes()[:4] == b"\x89PNG"
    measured = report["profiles"][0]["step_time"]
    predicted = next(p["step_time"] for p in report["predictions"] if p["ranks"] == 2)
    assert all(p["ranks"] == 1024 or p["scaling_efficiency"] is not None
               for p in report["predictions"] if p["ranks"] <= 32)
    error = predicted / measured - 1
    print(f"2 ranks: predicted {predicted * 1e3:.3f} ms, measured {measured * 1e3:.3f} ms "
          f"({error:+.1%}); network {report['network']['spec']}")
    if abs(error) > 0.25:
        from d500.ledger import Ledger
        busy = Ledger(home / "ledger.sqlite").get(run_id)["details"]["load_average"]
        if busy["during"] > 0.1 * busy["usable_cores"]:
            pytest.skip(f"other processes used {busy['during']} of the {busy['usable_cores']} "
                        f"cores during the run: predicted {predicted * 1e3:.3f} ms, measured "
                        f"{measured * 1e3:.3f} ms ({error:+.0%})")
    assert math.isfinite(error) and abs(error) <= 0.25


def tensor_record(activation: int = 32 * 64 * 4, grads: float = 35880.0) -> dict:
    """A `tensor: 2` run at 2 ranks: one allreduce of a [32, 64] float32 partial output a step
    (comm.py's ring counts), each rank holding `grads` bytes of parameters (and as many of
    gradients and momentum)."""
    per_rank = []
    for r in range(2):
        sent, received = ring_counts(activation // 4, 2, r)
        per_rank.append({"allreduce": {"calls": 1, "sent": 4 * sent, "received": 4 * received,
                                       "seconds": 0.0}})
    run = run_record("sync", 2, per_rank, compute=1e-3, batch=32)
    run["hyperparameters"].update(tensor=2, bucket_bytes=16384)
    for rank in run["details"]["ranks"]:
        rank["scheme"] = {"param_bytes": grads, "grad_bytes": grads, "optimizer_bytes": grads}
    return run


def test_tensor_parallelism_by_hand():
    """T = 2 kept, D = N / 2 grows: at 8 ranks (D = 4) the step is compute / 4, the tensor
    allreduce of a quarter of the activation over 2 ranks, and the data allreduce of the rank's
    35,880 gradient bytes over 4 ranks in ceil(35,880 / 16,384) = 3 buckets."""
    p = scaling.Profile.from_run(tensor_record())
    a, b = NET.alpha, NET.beta
    assert (p.tensor, p.grad_bytes, p.memory, p.label) == (2, 35880, 3 * 35880, "sync / tensor 2")
    assert p.collectives[0].nbytes == 8192  # the [32, 64] float32 partial output, read back
    tensor = 2 * a + (8192 / 4) * b  # 2(T-1) alpha + 2(T-1)/T (B/D) beta at T = 2
    data = 3 * (6 * a + 1.5 * (35880 / 3) * b)  # 3 buckets: 2(D-1) alpha + 2(D-1)/D G beta
    assert scaling.step_time(p, 8, NET) == pytest.approx(1e-3 / 4 + tensor + data)
    assert scaling.step_time(p, 2, NET) == pytest.approx(1e-3 + 2 * a + 8192 * b)  # measured
    assert scaling.step_time(p, 1, NET) == pytest.approx(2e-3)  # one rank: both shards
    weak = scaling.step_time(p, 8, NET, weak=True)  # each data group keeps its 32 samples
    assert weak == pytest.approx(1e-3 + 2 * a + 8192 * b + data)
    assert scaling.efficiency(p, 8, NET, weak=True) == pytest.approx(2e-3 / (2 * weak))
    assert scaling.step_time(p, 9, NET) is None  # no whole tensor groups
    assert "do not hold whole tensor groups of 2" in scaling.impossible(p, 9)
    assert scaling.step_time(p, 128, NET) is None  # 64 data ranks for 32 samples
    four = tensor_record()
    four["world_size"] = 4
    with pytest.raises(UsageError, match="splits 2 tensor ways at 4 ranks"):
        scaling.Profile.from_run(four)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")
def test_a_measured_tensor_run_reads_back_its_split(tmp_path):
    """tensor-parallel on digits-mlp at `mpiexec -n 2`: the model reads one allreduce a step of
    fc2's [32, 64] float32 partial output (the split's own figure), the memory the judge
    believed, and predicts every even size up to 64 ranks (the global batch's 32 data ranks
    x 2)."""
    home = tmp_path / "home"
    run = jobs.train(home, 2, jobs.LEVEL3 / "digits-mlp.yaml", jobs.ENTRIES / "tensor-parallel",
                     "--seed", "0")
    assert run.returncode == 0, run.stderr[-2000:]
    run_id = json.loads(run.stdout)[0]["run_id"]
    from d500.ledger import Ledger
    recorded = Ledger(home / "ledger.sqlite").get(run_id)
    p = scaling.Profile.from_run(recorded)
    assert [(c.name, c.calls, c.nbytes) for c in p.collectives] == [("allreduce", 1, 8192)]
    assert p.memory == recorded["figures"]["memory_per_rank"] == 107640
    rows = scaling.predict([p], NET, (8, 128))
    assert rows[0].step is not None and rows[0].efficiency is not None
    assert rows[1].step is None  # 32 data ranks at most: 64 at 128 ranks


def pipeline_record(schedule: str = "1f1b", stash: float = 2 * 8 * 256, n0: int = 2,
                    grads: float = 10000.0) -> dict:
    """A `pipeline: 2, micro_batches: 4` run at `n0` ranks of a 32-sample batch: its cut sends
    256 bytes a sample (a [., 64] float32 hidden layer), the costliest stage 1.25 x the mean,
    each rank holding `grads` bytes of parameters (as many of gradients and momentum) and
    `stash` bytes of micro-batch inputs at its peak."""
    run = run_record("sync", n0, [{} for _ in range(n0)], compute=1e-3, batch=32)
    run["hyperparameters"].update(pipeline=2, micro_batches=4, pipeline_schedule=schedule,
                                  schedule="cosine", bucket_bytes=16384)
    run["details"]["scheme_details"] = {"partition": {
        "stages": [{"stage": 0, "send_bytes_per_sample": 256}, {"stage": 1,
                                                                 "send_bytes_per_sample": 0}],
        "imbalance": 1.25}}
    for rank in run["details"]["ranks"]:
        rank["scheme"] = {"param_bytes": grads, "grad_bytes": grads, "optimizer_bytes": grads,
                          "stash_bytes_peak": stash}
    return run


def test_pipeline_by_hand():
    """P = 2 kept, D = N / 2 grows: at 8 ranks (D = 4) a data group's 8 samples go as 4
    micro-batches of 2; 5 slots of a quarter of the stage's compute / 4 and a 512-byte message
    each way, then the stage's 10,000 gradient bytes allreduced over 4 ranks (one bucket); the
    bubble 1/5; memory: the states and 1F1B's 2 stashed micro-batches of 2 x 256 bytes (GPipe's
    4). At 64 ranks one sample a group: one micro-batch, bubble 1/2. Attack: a rank recording
    a cut of 0 bytes a sample while sending 16,384 bytes a step is modelled by what it sent."""
    p = scaling.Profile.from_run(pipeline_record())
    a, b = NET.alpha, NET.beta
    assert (p.pipeline, p.micro, p.schedule, p.crossing, p.group) == (2, 4, "1f1b", 256, 2)
    assert p.label == "sync / pipeline 2 x 4 1f1b"
    slot = 1e-3 / 4 / 4 + 2 * (a + 512 * b)
    data = 6 * a + 1.5 * 10000 * b  # 2(D-1) alpha + 2(D-1)/D G beta, D = 4
    assert scaling.p2p_bytes(p, 8) == 512
    assert scaling.step_time(p, 8, NET) == pytest.approx(5 * slot + data)
    assert scaling.bubble(p, 8) == pytest.approx(1 / 5)
    assert scaling.memory(p, 8) == pytest.approx(30000 + 2 * 2 * 256)
    assert scaling.step_time(p, 2, NET) == pytest.approx(5 * (1e-3 / 4 + 2 * (a + 2048 * b)))
    assert scaling.memory(p, 2) == pytest.approx(30000 + 2 * 8 * 256)  # what the run held
    assert scaling.step_time(p, 1, NET) == pytest.approx(1e-3 * 2 / 1.25)  # one rank: both
    assert scaling.memory(p, 1) is None and scaling.bubble(p, 1) is None  # not a pipeline
    one = 1e-3 / 32 + 2 * (a + 256 * b)
    assert scaling.step_time(p, 64, NET) == pytest.approx(2 * one + 62 * a + 62 / 32 * 1e4 * b)
    assert scaling.bubble(p, 64) == pytest.approx(1 / 2)
    assert scaling.memory(p, 64) == pytest.approx(30000 + 1 * 256)  # m = 1: one in flight
    assert scaling.step_time(p, 128, NET) is None  # 64 data groups for 32 samples
    assert "whole pipeline groups of 2" in scaling.impossible(p, 9)
    gpipe = scaling.Profile.from_run(pipeline_record("gpipe", stash=4 * 8 * 256))
    older = pipeline_record("gpipe")  # recorded before pipeline_schedule: it was `schedule`
    del older["hyperparameters"]["pipeline_schedule"]
    older["hyperparameters"]["schedule"] = "gpipe"
    assert scaling.Profile.from_run(older).schedule == "gpipe"
    assert scaling.memory(gpipe, 8) == pytest.approx(30000 + 4 * 2 * 256)  # all M in flight
    assert scaling.step_time(gpipe, 8, NET) == scaling.step_time(p, 8, NET)  # the same bubble
    rows = scaling.predict([p], NET, (8, 128))
    assert (rows[0].bubble, rows[0].memory) == (pytest.approx(0.2), pytest.approx(31024))
    assert (rows[1].step, rows[1].bubble, rows[1].memory) == (None, None, None)
    claimed = pipeline_record()  # a rank records a cut of 0 bytes, sending 16,384 a step
    claimed["details"]["scheme_details"]["partition"]["stages"][0]["send_bytes_per_sample"] = 0
    claimed["details"]["ranks"][0]["collectives"] = {"send": {"calls": 4, "sent": 16384}}
    assert scaling.Profile.from_run(claimed).crossing == 512  # what was sent, per sample
    hybrid = scaling.Profile.from_run(pipeline_record(n0=4))  # data 2 x pipeline 2
    assert hybrid.label == "sync / pipeline 2 x 4 1f1b / data 2"  # its own line in the plot
    assert scaling.p2p_bytes(hybrid, 4) == 256 * 4  # 16 samples a group, micro-batches of 4
    with pytest.raises(UsageError, match="cuts 2 pipeline stages at 3 ranks"):
        scaling.Profile.from_run(pipeline_record(n0=3))


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")
def test_a_measured_pipeline_run_reads_back_its_cut_and_bubble(tmp_path):
    """pipeline-1f1b on digits-mlp (one epoch) at `mpiexec -n 2`, modelled: the
    model's bytes of a micro-batch over the cut (the recorded partition's 512 bytes a sample x 8
    samples) x M = 4 are what each stage sent a step (activations forward, their gradients back);
    1F1B's stash is its bound of P = 2 micro-batches of 8 samples of 768 bytes; the model's bubble
    at 2 ranks is the run's theory, 1/5, and the measured bubble is no less (a stage waits at
    least for the fill or the drain; above it, what this shared machine adds is printed: 0.29 to
    0.66 here at load 3 to 16, with per-message costs on micro-batches of 8). `d500 scale`'s
    own run is test_the_2_rank_prediction_holds_against_the_measured_step_time's."""
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 1})
    run = jobs.train(home, 2, wl, jobs.ENTRIES / "pipeline-1f1b", "--seed", "0")
    run_id = jobs.last_run(home)["id"]
    from d500.ledger import Ledger
    recorded = Ledger(home / "ledger.sqlite").get(run_id)
    ranks = recorded["details"]["ranks"]
    assert ranks, (run.returncode, run.stderr[-2000:])
    p = scaling.Profile.from_run(recorded)
    assert (p.pipeline, p.micro, p.schedule, p.crossing) == (2, 4, "1f1b", 512)
    assert scaling.p2p_bytes(p, 2) == 512 * 8
    assert [(c.name, c.calls, c.nbytes) for c in p.collectives] == [
        ("recv", 4, 512 * 8), ("send", 4, 512 * 8)]  # read back as point-to-point messages
    for r in ranks:  # stage 0 sends activations, stage 1 their gradients: M messages a step
        assert r["collectives"]["send"]["calls"] == 4
        assert r["collectives"]["send"]["sent"] == 4 * scaling.p2p_bytes(p, 2)
    kept = 2 * 8 * (256 + 512)  # 1F1B: P micro-batches in flight, not M; what torch's graph
    assert p.activation == kept  # of stage 0 saves: its input and its ReLU's output a sample
    assert scaling.memory(p, 2) == recorded["figures"]["memory_per_rank"] + kept
    rows = {r.ranks: r for r in scaling.predict([p], NET, (2, 8, 1024))}
    assert rows[2].bubble == recorded["figures"]["bubble_theory"] == pytest.approx(0.2)
    assert rows[8].bubble == pytest.approx(0.2)
    assert rows[8].memory < rows[2].memory  # 4 groups: micro-batches of 2
    assert rows[1024].step is None  # 512 data groups for 32 samples
    measured = recorded["figures"]["bubble_fraction"]
    print(f"bubble measured {measured:.3f}, theory 0.200 ({measured / 0.2 - 1:+.0%})")
    assert measured >= 0.8 * 0.2  # a stage waits at least for the fill or the drain


def hybrid_record(claimed: float = 10000.0) -> dict:
    """pipeline_record at {data: 2, pipeline: 2}, 4 ranks: each rank allreduced its stage's
    10,000 gradient bytes (2,500 float32) over its data pair once a step (comm.ring_counts),
    while claiming `claimed` bytes of parameters, gradients and momentum."""
    run = pipeline_record(n0=4, grads=claimed)
    run["hyperparameters"].update(data=2)
    for r, rank in enumerate(run["details"]["ranks"]):
        sent, received = ring_counts(2500, 2, r % 2)
        rank["collectives"] = {"allreduce": {"calls": 1, "sent": 4 * sent,
                                             "received": 4 * received},
                               "send": {"calls": 4, "sent": 4 * 1024},
                               "recv": {"calls": 4, "received": 4 * 1024}}
    return run


def test_a_hybrid_runs_data_allreduce_is_read_back_over_its_data_ranks():
    """{data: 2, pipeline: 2} at 4 ranks: a stage's allreduce ran over its data pair, so the
    10,000 bytes each rank sent a step read back as a 10,000-byte gradient (over the 4 ranks of
    the world, as before: 6,667). At the measured 4 ranks the step is 5 slots of micro-batches
    of 4 samples (1,024 B over the cut) and that allreduce over 2 ranks; at 16 ranks (D = 8)
    micro-batches of 1, over 8. Attack: ranks claiming 1,000 gradient bytes while their
    allreduces moved 10,000 are modelled by what moved."""
    p = scaling.Profile.from_run(hybrid_record())
    a, b = NET.alpha, NET.beta
    assert p.label == "sync / pipeline 2 x 4 1f1b / data 2"
    assert {c.name: (c.calls, c.nbytes) for c in p.collectives}["allreduce"] == (1, 10000)
    assert p.grad_bytes == 10000
    over_2 = 2 * a + 10000 * b  # 2(D-1) alpha + 2(D-1)/D G beta, D = 2
    measured = 5 * (1e-3 / 4 + 2 * (a + 1024 * b)) + over_2
    assert scaling.step_time(p, 4, NET) == pytest.approx(measured)
    over_8 = 14 * a + 1.75 * 10000 * b
    assert scaling.step_time(p, 16, NET) == pytest.approx(
        5 * (1e-3 / 4 / 4 + 2 * (a + 256 * b)) + over_8)
    assert scaling.step_time(p, 2, NET) == pytest.approx(5 * (2e-3 / 4 + 2 * (a + 2048 * b)))
    shirked = scaling.Profile.from_run(hybrid_record(claimed=1000.0))
    assert shirked.grad_bytes == 10000
    assert scaling.step_time(shirked, 16, NET) == scaling.step_time(p, 16, NET)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(jobs.MPIEXEC is None, reason="no mpiexec beside Python")
def test_a_measured_hybrid_run_models_its_data_dimension(tmp_path):
    """hybrid-data-pipeline ({data: 2, pipeline: 2}) on digits-mlp at `mpiexec -n 4`, one
    epoch, then `d500 scale` of its ledger row: each stage's gradient allreduce over its data
    pair reads back as the stage's gradient bytes (33,280 B fc1, 35,624 B fc2 + fc3), not 2/3 of
    them; the data dimension modelled is the larger stage's; at the measured 4 ranks the bubble
    is the run's theory; data grows from 2 to 8 at 16 ranks."""
    home = tmp_path / "home"
    wl = jobs.workload(tmp_path, "digits-mlp", budget={"max_epochs": 1})
    out = jobs.train(home, 4, wl, jobs.ENTRIES / "hybrid-data-pipeline", "--seed", "0")
    run_id = jobs.last_run(home)["id"]
    from d500.ledger import Ledger
    recorded = Ledger(home / "ledger.sqlite").get(run_id)
    ranks = recorded["details"]["ranks"]
    assert ranks, (out.returncode, out.stderr[-2000:])
    stage = {r["rank"]: r["scheme"]["grad_bytes"] for r in ranks}
    assert sorted(set(stage.values())) == [33280, 35624]
    p = scaling.Profile.from_run(recorded)
    assert (p.ranks, p.pipeline, p.group) == (4, 2, 2) and p.label.endswith("/ data 2")
    assert {c.name: c.nbytes for c in p.collectives}["allreduce"] == 35624
    assert p.grad_bytes == 35624
    report = json.loads(jobs.plain_d500(home, "scale", str(run_id), "--network",
                                        "2us,12.5GB/s", "--ranks", "4,16", "--json").stdout)
    rows = {r["ranks"]: r for r in report["predictions"]}
    assert rows[4]["bubble"] == pytest.approx(recorded["figures"]["bubble_theory"])
    a, b = NET.alpha, NET.beta
    data = {4: 2 * a + 35624 * b, 16: 14 * a + 1.75 * 35624 * b}  # over D = 2, then 8
    for n, row in rows.items():
        m = scaling.micro_batches(p, n)
        pipe = (m + 1) * (scaling.compute_time(p, n, False) / m
                          + 2 * (a + scaling.p2p_bytes(p, n) * b))
        assert row["step_time"] == pytest.approx(pipe + data[n]), n


def composed_record(n0: int = 4, grads: float = 10000.0, claimed: float | None = None) -> dict:
    """A `pipeline: 2, tensor: 2, micro_batches: 4` (1F1B) run at `n0` ranks of a 32-sample
    batch: each stage's cut sends 256 bytes a sample to its tensor peer (micro-batches of 8: 4
    messages of 2,048 B each way), and its blocks allreduce a micro-batch's [8, 64] float32
    activation twice (forward and backward) over the 2 tensor ranks, 8 calls a step; each rank
    holds `grads` bytes of parameters (its shard; as many of gradients, unless `claimed`, and
    of momentum) and 1F1B's 2 stashed micro-batches of 8 x 256 B."""
    per_rank = []
    for r in range(n0):
        sent, received = ring_counts(8 * 64, 2, r % 2)
        per_rank.append({"allreduce": {"calls": 8, "sent": 8 * 4 * sent,
                                       "received": 8 * 4 * received},
                         "send": {"calls": 4, "sent": 4 * 2048},
                         "recv": {"calls": 4, "received": 4 * 2048}})
    run = pipeline_record(n0=n0, grads=grads)
    run["hyperparameters"].update(tensor=2)
    for rank, c in zip(run["details"]["ranks"], per_rank):
        rank["collectives"] = c
        rank["scheme"]["grad_bytes"] = grads if claimed is None else claimed
    return run


def test_tensor_inside_pipeline_stages_by_hand():
    """{pipeline: 2, tensor: 2}: P and T kept, D = N / 4 grows. At the measured 4 ranks, 5 slots
    of a micro-batch's compute, its 2,048-byte message each way and its 2 tensor allreduces of
    2,048 B (the 8 a step over 4 micro-batches); at 16 ranks (D = 4) micro-batches of 2
    samples: a quarter of the compute, 512-byte messages and allreduces, then the rank's 10,000
    gradient bytes allreduced over 4 data ranks. Memory per rank: the shard's states (30,000 B,
    the same at every D: nothing shards them over data) plus 1F1B's stash, which falls with
    the micro-batch. Attack: ranks claiming no gradient still average their parameters'."""
    p = scaling.Profile.from_run(composed_record())
    a, b = NET.alpha, NET.beta
    assert (p.tensor, p.pipeline, p.group, p.crossing) == (2, 2, 4, 256)
    assert p.label == "sync / tensor 2 / pipeline 2 x 4 1f1b"
    assert {c.name: (c.calls, c.nbytes) for c in p.collectives}["allreduce"] == (8, 2048)
    ar = 2 * a + 2048 * b  # 2(T-1) alpha + 2(T-1)/T B beta at T = 2
    measured = 5 * (1e-3 / 4 + 2 * (a + 2048 * b) + 2 * ar)
    assert scaling.step_time(p, 4, NET) == pytest.approx(measured)
    slot = 1e-3 / 4 / 4 + 2 * (a + 512 * b) + 2 * (2 * a + 512 * b)
    data = 6 * a + 1.5 * 10000 * b  # one 16,384-byte bucket over D = 4
    assert scaling.step_time(p, 16, NET) == pytest.approx(5 * slot + data)
    assert scaling.step_time(p, 1, NET) == pytest.approx(1e-3 * 4 / 1.25)  # one rank: all
    assert scaling.bubble(p, 16) == pytest.approx(1 / 5)
    stash = {4: 2 * 8 * 256, 8: 2 * 4 * 256, 16: 2 * 2 * 256, 64: 2 * 1 * 256}
    for n, held in stash.items():
        assert scaling.memory(p, n) == pytest.approx(30000 + held)  # states kept, stash falls
    assert scaling.memory(p, 128) == pytest.approx(30000 + 256)  # one sample: one in flight
    for n in (6, 10):
        assert scaling.step_time(p, n, NET) is None
        assert "do not hold whole tensor x pipeline groups of 4" in scaling.impossible(p, n)
    assert scaling.step_time(p, 256, NET) is None  # 64 data groups for 32 samples
    weak = scaling.step_time(p, 16, NET, weak=True)  # each data group keeps its 32 samples
    assert weak == pytest.approx(measured + data)
    shirked = scaling.Profile.from_run(composed_record(claimed=0.0))
    assert shirked.grad_bytes == 10000
    assert scaling.step_time(shirked, 16, NET) == scaling.step_time(p, 16, NET)
    with pytest.raises(UsageError, match="splits 2 tensor ways in each of 2 pipeline stages at "
                                         "8 ranks: .* model a run at 4 ranks"):
        scaling.Profile.from_run(composed_record(n0=8))  # data 2: its allreduces mixed


def test_scale_shows_a_composed_run(tmp_path, monkeypatch, capsys):
    """`d500 scale RUN_ID` of a {pipeline: 2, tensor: 2} run: no refusal, its bubble and
    memory per rank in the pipelines' table; the sizes it cannot hold named under it."""
    from d500.distributed import scale_cli
    from d500.ledger import Ledger
    monkeypatch.setenv("D500_HOME", str(tmp_path))
    record = composed_record()
    run = Ledger(tmp_path / "ledger.sqlite").start_run(
        level=3, workload="text-lm", submission="tensor-pipeline", backend="torch", rank=0,
        world_size=4, hyperparameters=record["hyperparameters"])
    run.finish("succeeded", details=record["details"])
    assert scale_cli.main([str(run.id), "--network", "2us,12.5GB/s", "--ranks", "4,6,16"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "sync / tensor 2 / pipeline 2 x 4 1f1b" in out
    assert "0.20 / 34,096 B" in out and "0.20 / 31,024 B" in out  # bubble / memory at 4, 16
    assert "no prediction at 6 ranks: 6 ranks do not hold whole tensor x pipeline groups" in out


def test_torchs_baselines_name_their_own_traffic_and_scale_times_it_by_its_kind():
    """DDP, FSDP2, DTensor and torch.distributed.pipelining count their traffic themselves;
    each names it (it was all 'ddp_allreduce', so `d500 scale` called FSDP's allgathers and
    the pipeline's sends an allreduce), and the model times each by what it is."""
    from d500.distributed.ddp import DDPScheme
    from d500.distributed.dtensor import DTensorScheme
    from d500.distributed.fsdp import FSDPScheme
    from d500.distributed.pipelining import PipeliningScheme
    kinds = {cls.traffic_name: scaling.KINDS[cls.traffic_name]
             for cls in (DDPScheme, FSDPScheme, DTensorScheme, PipeliningScheme)}
    assert kinds == {"ddp_allreduce": "allreduce", "fsdp_gather_scatter": "blocks",
                     "dtensor_allreduce": "allreduce", "pipelining_send": "p2p"}


def test_scale_by_name_models_an_entrys_own_run_never_a_forced_import(tmp_path):
    """`d500 scale WORKLOAD` picks one run per entry and scheme: the newest of the entry's own,
    never one imported with --force past `d500 check` (its per-rank figures are unchecked), and
    a `d500 reproduce` run only where the entry has no run of its own."""
    from types import SimpleNamespace

    from d500.distributed import scale_cli

    def rec(rid: int, submission: str, compute: float, **where: Any) -> dict:
        r = run_record("sync", 2, [{}, {}], compute=compute)
        return {**r, "id": rid, "submission": submission, "workload": "w3",
                "status": "succeeded", **where}

    forced = {"id": 1, "entry": "e", "sha256": "a" * 64, "forced": True, "packages": 1}
    again = {"reproduction": {"package": "b" * 64, "entry": "e"}}
    runs = [rec(1, "e", 1e-3), rec(2, "e", 9e-3, details={**rec(0, "e", 9e-3)["details"],
                                                           **again}),
            rec(3, "e", 5e-9, source=forced, package=forced),
            rec(4, "lone", 2e-3, details={**rec(0, "lone", 2e-3)["details"], **again})]
    ledger = SimpleNamespace(runs=lambda **_: runs)
    picked = {p.compute for p in scale_cli._profiles(ledger, "w3")}
    assert picked == {1e-3, 2e-3}  # e's own run (not its reproduction, not the forced one)
