"""samples_per_second (shown on the boards) inflated by shrinking train_time in the record and
the MLLOG's figure lines alike, re-sealed: consistency finds the trainer's parts no longer fill
the last evaluation's wall time, which the log's own eval_stop anchors."""

from __future__ import annotations

import hashlib
import json

from d500.competition.check import check
from d500.competition.layout import mllog_member
from d500.competition.package import Package

from .packages import repack, reseal

TOKEN = ":::MLLOG "


def _faster(rid: int, factor: float):
    """An edit dividing run `rid`'s train_time by `factor` and multiplying samples_per_second
    by it, in its figures and its MLLOG's figure lines; the log's hash and the run re-sealed."""
    def edit(found: dict[str, bytes]) -> None:
        lines = found[mllog_member(rid)].decode().splitlines()
        records = [json.loads(line[len(TOKEN):]) for line in lines]
        for r in records:
            if "unit" in r["metadata"] and r["key"] == "train_time":
                r["value"] /= factor
            if "unit" in r["metadata"] and r["key"] == "samples_per_second":
                r["value"] *= factor
        log = found[mllog_member(rid)] = "".join(
            TOKEN + json.dumps(r) + "\n" for r in records).encode()

        def figures(f: dict) -> None:
            f["train_time"] /= factor
            f["samples_per_second"] *= factor

        def record(rec: dict) -> None:
            for art in rec["artifacts"]:
                if art[0] == rec["row"]["mllog"]:
                    art[1:] = [hashlib.sha256(log).hexdigest(), len(log)]
        reseal(rid, change=figures, record=record)(found)
    return edit


def test_a_train_time_shrunk_to_inflate_samples_per_second_is_caught(digits_package, rules_dir,
                                                                     tmp_path):
    """train_time divided by 4, samples_per_second times 4: check passed it (the parts at most
    the wall time, the rate their quotient); the only problem now is the parts' shortfall."""
    pkg = Package.open(digits_package)
    rid = next(r.origin_id for r in pkg.runs() if r.trial is None and r.status == "succeeded")
    assert not [p for p in check(pkg, rules_dir).problems if "wall time" in p]
    forged = Package.open(repack(digits_package, tmp_path / "fast.tar.gz", _faster(rid, 4)))
    run = next(r for r in forged.runs() if r.origin_id == rid)
    assert run.figures["samples_per_second"] > 3.9 * next(
        r for r in pkg.runs() if r.origin_id == rid).figures["samples_per_second"]
    problems = check(forged, rules_dir).problems
    assert len(problems) == 1 and f"run {rid}:" in problems[0] and \
        "under 0.5 of the last evaluation's wall time" in problems[0], problems
