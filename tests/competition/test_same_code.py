"""One entry's code under several entry names (issue 17): each name gets required seeds of its own
and, re-run by the organiser, a draw of its own, so K names would rank as the best of K draws.
The same code (d500.competition.same_code: the files up to names, comments and docstrings) is one
entry: `d500 check` and `d500 ledger import` say whose code it is, and the board ranks the first
imported, listing the later name after it, unranked.

The normal form's rules on source text (milliseconds), and the attack with real runs (`-m slow`):
the digits entry's code sent again under another name with a comment added."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from d500.competition import same_code
from d500.competition.same_code import digest, python_form

from .conftest import OPTIMIZER, SUBMISSION

COPY = "digits-copycat"


def _files(yaml: str = SUBMISSION, code: str = OPTIMIZER) -> dict[str, bytes]:
    return {"submission.yaml": yaml.encode(), "guarded.py": code.encode()}


def test_a_trivial_edit_keeps_the_digest():
    base = digest(_files())
    renamed = SUBMISSION.replace("name: digits-packager", f"name: {COPY}").replace(
        "description: Momentum SGD", "description: An original optimizer")
    commented = "# written from scratch\n" + OPTIMIZER.replace(
        "    def update", "\n\n    # the step  \n    def update").replace(
        '"""Momentum SGD with a bug', '"""Our own work, with a bug')
    local = OPTIMIZER.replace("            raise", "            at = int(t)\n            raise"
                              ).replace("at step {int(t)}", "at step {at}")
    other = local.replace("at = int(t)", "step = int(t)").replace("{at}", "{step}")
    assert "{at}" in local and "{step}" in other
    assert digest(_files(code=local)) == digest(_files(code=other)) != base
    for yaml, code in ((renamed, OPTIMIZER), (SUBMISSION, commented)):
        assert digest(_files(yaml, code)) == base


def test_a_change_that_can_change_training_changes_the_digest():
    base = digest(_files())
    for yaml, code in (
            (SUBMISSION.replace("lr: 0.05", "lr: 0.06"), OPTIMIZER),  # a hyperparameter
            (SUBMISSION, OPTIMIZER.replace(">= self.fail_at", "> self.fail_at")),
            (SUBMISSION, OPTIMIZER.replace("self.fail_at and", "self.fail_atx and")),  # attr
            (SUBMISSION, OPTIMIZER.replace("params, grads", "ps, gs")),  # parameters
            (SUBMISSION, OPTIMIZER + "\nEXTRA = 1\n")):  # a module-level statement
        assert digest(_files(yaml, code)) != base, (yaml, code)
    assert digest({**_files(), "weights.bin": b"\0"}) != base


@pytest.mark.parametrize("one, other, same", [
    # a global read is not a local: renaming it reads another name
    ("x = 1\ndef f():\n    y = 2\n    return x + y\n",
     "z = 1\ndef f():\n    y = 2\n    return z + y\n", False),
    ("x = 1\ndef f():\n    y = 2\n    return x + y\n",
     "x = 1\ndef f():\n    q = 2\n    return x + q\n", True),
    # a comprehension's variable is its own; the global x after it is not
    ("def f(a):\n    return [x for x in a] + [x]\n",
     "def f(a):\n    return [y for y in a] + [x]\n", True),
    ("def f(a):\n    return [x for x in a] + [x]\n",
     "def f(a):\n    return [y for y in a] + [y]\n", False),
    # a closure reads its function's local
    ("def f(a):\n    b = a\n    def g():\n        return b\n    return g\n",
     "def f(a):\n    d = a\n    def g():\n        return d\n    return g\n", True),
    # a parameter's name is what a keyword binds (and what d500 reads of some classes): kept
    ("def f(a):\n    return a\n", "def f(b):\n    return b\n", False),
    # a file reading locals() keeps every name
    ("def f(a):\n    b = a\n    return locals()\n",
     "def f(a):\n    c = a\n    return locals()\n", False),
    # class attributes keep their names
    ("class C:\n    a = 1\n", "class C:\n    b = 1\n", False),
])
def test_only_names_bound_in_a_function_are_renamed(one, other, same):
    assert (python_form(one) == python_form(other)) is same


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_one_entrys_code_under_two_names_is_one_entry(organiser, entry_dir, rules_dir, run_d500,
                                                       tmp_path):
    """The digits entry's code under a second name, a comment added, trained and tuned for real
    in a home of its own and packaged; the organiser, who imported the digits package first and
    re-ran it at drawn seeds (the organiser fixture, shared), checks and imports the copy: check
    and import each say in one line whose code it is; the copy is re-run at the organiser's
    drawn seeds too (a draw of its own); the board ranks one row, the first imported's, and
    lists every row of the copy after it, unranked, naming the digits entry; the level-2 views
    do not score the copy. 108-160 s at load 10-11 on 2 cores before the organiser's side was
    shared (two trainings and tunings, four fresh-seed runs); now one training and tuning and
    two fresh-seed runs of its own."""
    from d500.competition import same_code
    from d500.ledger import Ledger
    from d500.training import score, views

    digits_package = organiser / "digits-packager.tar.gz"
    entry = tmp_path / COPY
    shutil.copytree(entry_dir, entry)
    (entry / "submission.yaml").write_text(
        SUBMISSION.replace("name: digits-packager", f"name: {COPY}"))
    (entry / "guarded.py").write_text("# our own optimizer\n" + OPTIMIZER)
    home = tmp_path / "copy-home"
    workload = str(rules_dir / "2-training" / "digits-mlp.yaml")
    copy = tmp_path / f"{COPY}.tar.gz"
    for args in (("train", workload, "--submission", str(entry), "--seeds", "2",
                  "--threads", "1"),
                 ("tune", workload, "--submission", str(entry), "--threads", "1"),
                 ("package", str(entry), "--out", str(copy))):
        done = run_d500(home, *args)
        assert done.returncode in (0, 1), done.stderr
    org = Path(shutil.copytree(organiser / "org", tmp_path / "organiser"))
    rules = ("--rules", str(rules_dir))
    assert "code is" not in (organiser / "import.txt").read_text()  # the first import
    said = (f"entry {COPY}'s code is entry digits-packager's (package "
            f"{_sha(digits_package)[:12]}, imported first")
    checked = run_d500(org, "check", str(copy), *rules)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    [line] = [x for x in checked.stdout.splitlines() if said in x]
    assert line.lstrip().startswith("warning  identity: ")
    strict = run_d500(org, "check", str(copy), "--strict", *rules)
    assert strict.returncode == 1 and said in strict.stdout, strict.stdout
    second = run_d500(org, "ledger", "import", str(copy), *rules)
    assert second.returncode == 0, second.stdout + second.stderr
    assert [x for x in second.stdout.splitlines() if said in x] != [], second.stdout
    # the organiser's draw for the copy (the digits package's is the fixture's)
    done = run_d500(org, "reproduce", str(copy), "--fresh-seeds", "2", *rules)
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
    said = done.stdout + done.stderr  # the runs score, and reproduce says so
    assert "scored: the boards of" in said and "rank each result re-run here" in said, said
    from d500.leaderboard import ranking
    with Ledger(org / "ledger.sqlite") as book:
        [board] = [b for b in ranking.build(book, level=2) if b.workload == "digits-mlp"]
    ranked = [e for e in board.entries if e.rank is not None]
    assert ranked and {e.submission for e in ranked} == {"digits-packager"}, [
        (e.submission, e.rank, e.seeds_note) for e in board.entries]
    assert all(ranking.drawn_entry(e) for e in ranked)  # its drawn seeds score (by load or not)
    copies = [e for e in board.entries if e.submission == COPY]
    assert len(copies) == 2 and any(ranking.drawn_entry(e) for e in copies)
    note = f"unranked: its code is entry digits-packager's (package {_sha(digits_package)[:8]})"
    assert all(e.seeds_note == note and e.rank is None for e in copies)
    assert board.entries.index(ranked[0]) < min(board.entries.index(e) for e in copies)
    text = run_d500(org, "leaderboard", "--level", "2")
    assert text.returncode == 0 and f"{COPY} · " in text.stdout and note in text.stdout, \
        text.stdout
    # the level's views: the copy's seeds are not scored, and it is no entry of the profile
    view = f"its code is entry digits-packager's (package {_sha(digits_package)[:8]}): unranked"
    with Ledger(org / "ledger.sqlite") as book:
        entries = score.entries(book.runs(level=2), same_code.copies(book))
    notes = views.seeds_view(entries).notes
    assert any(n.startswith(f"not scored: digits-mlp / {COPY}") and view in n for n in notes)
    assert [row[0] for row in views.profile_view(entries).rows
            if COPY in row[0]] == [], "a copy is no entry of the profile"


def test_a_forced_package_is_never_the_first_of_its_code(tmp_path):
    """A forced package A imported first, then a whole package B of A's code: B ranks, A is the
    copy (first imported would have left nothing of that code ranked, A being ranked apart)."""
    import time as clock

    from d500.ledger import Ledger
    from d500.ledger.imports import package_folder
    ledger = Ledger(tmp_path / "ledger.sqlite")
    code = {"submission.yaml": b"name: x\n", "opt.py": b"def f(a):\n    return a\n"}
    for entry, sha, forced in (("forced-a", "a" * 64, 1), ("whole-b", "b" * 64, 0),
                               ("later-c", "c" * 64, 0)):
        with ledger._write() as db:
            db.execute("INSERT INTO packages (sha256, entry, manifest, signer, imported, forced,"
                       " problems, chain) VALUES (?,?,?,?,?,?,?,?)",
                       (sha, entry, "{}", None, clock.time(), forced, "[]", "[]"))
        folder = package_folder(ledger, sha) / "files" / "submission"
        folder.mkdir(parents=True)
        for name, data in code.items():
            (folder / name).write_bytes(data)
    copies = same_code.copies(ledger)
    assert set(copies) == {"a" * 64, "c" * 64}
    assert copies["a" * 64] == copies["c" * 64] == same_code.Copy("whole-b", "b" * 64)
