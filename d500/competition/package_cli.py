"""`d500 package SUBMISSION_DIR --out FILE [--ledger PATH] [--sign KEYFILE]`: pack every ledger run
of an entry (all seeds and trials, every status, level and backend), its logs, provenance and
files into one file for an organiser, and print what went in."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

from d500.cli import ArgumentParser
from d500.errors import UsageError
from d500.paths import entry_argument, non_empty

ENDINGS = (".tar.gz", ".tgz")  # what a package is: a gzipped tar


def main(argv: list[str], prog: str = "d500 package") -> int:
    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("submission", metavar="SUBMISSION_DIR", type=entry_argument,
                   help="the entry: a folder with submission.yaml, or that file (or the name "
                        "of one of d500's example entries)")
    p.add_argument("--out", required=True, metavar="FILE", type=non_empty("a file name"),
                   help="the package to write (a .tar.gz or .tgz)")
    p.add_argument("--ledger", metavar="PATH", type=non_empty("a ledger file"),
                   help="the ledger file (default $D500_HOME/ledger.sqlite)")
    p.add_argument("--sign", metavar="KEYFILE",
                   help="sign with this ed25519 private key (make one with d500 keygen)")
    args = p.parse_args(argv)
    out = Path(args.out)
    if not out.is_dir() and not out.name.lower().endswith(ENDINGS):  # x.zip held a tar.gz
        raise UsageError(f"{out}: --out writes a gzipped tar: a file name ending in "
                         f"{' or '.join(ENDINGS)} (e.g. {out.with_suffix('').name}.tar.gz)")
    from d500.competition.export import build
    from d500.competition.package import Package

    out = build(args.submission, args.out, args.ledger, args.sign,
                warn=lambda text: print(f"{prog}: warning: {text}", file=sys.stderr))
    for line in summary(Package.open(out)):
        print(line)
    return 0


def summary(pkg: Any) -> list[str]:
    """A few lines: the entry, the runs by level and status, the size, signed or not."""
    from d500.competition.layout import SUBMISSION_FILES

    runs = pkg.runs()
    size = pkg.path.stat().st_size
    m = pkg.manifest
    head = (f"{pkg.path}: entry '{m['entry']}', {len(runs)} run(s), {_size(size)}, "
            f"sha256 {pkg.sha256[:16]}…")
    lines = [head]
    for level in sorted({r.level for r in runs}, key=lambda v: (v is None, v)):
        mine = [r for r in runs if r.level == level]
        statuses = Counter(r.status for r in mine)
        trials = sum(1 for r in mine if r.trial is not None)
        workloads = sorted({str(r.workload) for r in mine})
        backends = sorted({str(r.backend) for r in mine})
        lines.append(f"  level {level}: {len(mine)} run(s) ({len(mine) - trials} seeded, "
                     f"{trials} tuning trial(s)): "
                     + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
                     + f"; {', '.join(workloads)} on {', '.join(backends)}")
    files = sum(1 for n in pkg.names() if n.startswith(SUBMISSION_FILES))
    lines.append(f"  {len(pkg.studies())} study(ies), {files} submission file(s), "
                 f"{len(pkg.workload_files())} workload file(s), chain head "
                 f"{m['ledger']['chain_head'][0] if m['ledger']['chain_head'] else '-'}")
    sig = pkg.signature()
    lines.append(f"  signed: ed25519 {sig.public_key}" if sig is not None else
                 "  not signed (pass --sign KEYFILE; make a key with d500 keygen KEYFILE)")
    return lines


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB"):
        if n < 1000 or unit == "MB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"
