"""`d500 check PACKAGE [--rules DIR] [--trust PUBKEY ...] [--strict] [--json]`: the package checker.
Exit 0 with a short summary (what was checked and what was not, and its warnings), 1 with one
line per problem (warnings on stderr), 2 when the file is not a d500 package."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from d500.cli import ArgumentParser
from d500.errors import UsageError
from d500.paths import non_empty

HEX_KEY = re.compile(r"^[0-9a-fA-F]{64}$")
DESCRIPTION = ("Check a submission package: completeness, the rules, integrity, logs and "
               "convergence. Exit 0 with a short summary (what was checked and what was not), 1 "
               "with one line per problem, 2 when the file is not a d500 package.")


def main(argv: list[str], prog: str = "d500 check") -> int:
    p = ArgumentParser(prog=prog, description=DESCRIPTION)
    p.add_argument("package", type=non_empty("a package file"),
                   help="a package file (d500 package ... --out FILE)")
    p.add_argument("--rules", metavar="DIR",
                   help="the rulebook to check workload files against, laid out like levels/ "
                        "(default: d500's own)")
    p.add_argument("--trust", action="append", metavar="PUBKEY", default=[],
                   help="accept only a signature by this ed25519 public key (a .pub file from "
                        "d500 keygen, or 64 hex digits; repeat for more keys); an unsigned "
                        "package then fails")
    p.add_argument("--strict", action="store_true",
                   help="refuse on a warning too: runs made with another d500 version or "
                        "commit than this one, or from a dirty tree")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    from d500.competition.check import check
    from d500.competition.package import Package

    rules = None
    if args.rules is not None:
        rules = Path(args.rules)
        if not rules.is_dir():
            from d500.paths import no_folder
            raise UsageError(f"--rules {rules}: {no_folder(rules)} (a rulebook laid out like "
                             f"levels/: 2-training/*.yaml, ...)")
    trusted = [trusted_key(value) for value in args.trust]
    from d500 import progress
    with progress.shown(prog):  # 2.8 s at load 7 for a 6-run package said nothing meanwhile
        progress.step("reading the package")
        pkg = Package.open(args.package)
        progress.step("checking it")
        report = check(pkg, rules, trusted)
        progress.step("comparing its code with the entries imported here")
        report.notes += same_code_notes(pkg)
    if args.strict:
        report.problems += [f"strict: {note}" for note in report.notes]
    from d500.say import shown  # the package's own words: its escapes shown, never obeyed
    if args.json:
        print(json.dumps(as_json(pkg, report), indent=1))
    elif report.problems:
        for line in report.problems:
            print(shown(f"{pkg.path}: {line}"))
        for note in report.notes:
            print(shown(f"{pkg.path}: warning: {note}"), file=sys.stderr)
    else:
        print(shown(summary(pkg, report)))
    return 0 if report.passed else 1


def same_code_notes(pkg: Any) -> list[str]:
    """One line when the package's code is an entry's of another name already imported into
    this D500_HOME's ledger (d500.competition.same_code), or is one but for its numbers (a
    warning for a person: never merged); none without that ledger."""
    from d500.competition import same_code
    from d500.ledger import Ledger
    from d500.ledger.store import absent

    if absent():
        return []  # no ledger here: nothing imported (and none is made)
    ledger = Ledger.open_for_reading()
    entry = pkg.manifest.get("entry")
    try:
        copy = same_code.first_of(ledger, pkg)
        near = None if copy is not None else same_code.near_of(ledger, pkg)
    finally:
        ledger.close()
    if copy is not None:
        return [f"identity: {same_code.line(entry, copy)}"]
    return [] if near is None else [f"identity: {same_code.near_line(entry, near)}"]


def trusted_key(value: str) -> str:
    """A --trust value as hex: 64 hex digits as given, else the key in that file."""
    from d500.competition import signing
    if HEX_KEY.match(value) and not Path(value).exists():
        return value.lower()
    if re.fullmatch(r"[0-9a-fA-F]+", value) and not Path(value).exists():
        raise UsageError(f"--trust {value}: neither a key file nor an ed25519 public key's 64 "
                         f"hex digits ({len(value)} given)")
    return signing.public_key(value)


def summary(pkg: Any, report: Any) -> str:
    """The pass summary: what the package holds, what was checked, what was not."""
    m = pkg.manifest
    levels = ", ".join(map(str, m.get("levels") or []))
    head = (f"{pkg.path}: passed: entry '{m.get('entry')}' (level {levels}), {report.runs} "
            f"run(s), {report.studies} study(ies), {report.seeds} seed run(s); sha256 "
            f"{pkg.sha256[:16]}…")
    lines = [head]
    lines += [f"  checked  {line}" for line in report.checked]
    lines += [f"  not checked  {line}" for line in report.not_checked]
    lines += [f"  warning  {line}" for line in report.notes]
    lines += [f"  not scored  {line}" for line in report.not_scored]
    return "\n".join(lines)


def as_json(pkg: Any, report: Any) -> dict[str, Any]:
    return {"package": str(pkg.path), "sha256": pkg.sha256, "entry": pkg.manifest.get("entry"),
            "passed": report.passed, "problems": report.problems, "notes": report.notes,
            "checked": report.checked,
            "not_checked": report.not_checked, "not_scored": report.not_scored,
            "runs": report.runs, "studies": report.studies,
            "seed_runs": report.seeds, "scoring": report.scoring}
