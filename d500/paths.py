"""Where results, caches and compiled artifacts go.

One directory, `$D500_HOME` (default ./d500-results)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from d500.errors import UsageError

PACKAGE = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE.parent  # a checkout's root; in an installed wheel, site-packages


def shipped(name: str) -> Path:
    """A folder d500 ships beside its code: `levels` (the rulebook), `metrics` (the scoring) or
    `submissions` (the example entries). In a checkout d500/_shipped/NAME is a symlink to the
    top-level folder; the wheel carries a copy, so an installed d500 finds them too."""
    return (PACKAGE / "_shipped" / name).resolve()


def rulebook() -> Path:
    """The rulebook: one folder per level of workload files (levels/)."""
    return shipped("levels")


def scoring() -> Path:
    """The scoring: one metric definition per file (metrics/)."""
    return shipped("metrics")


def examples() -> Path:
    """The example entries (submissions/)."""
    return shipped("submissions")


def entry(text: str) -> str:
    """An entry as a command names it: a path (a folder with submission.yaml, or the file), or
    the name of one of d500's example entries (`sgd-momentum`: submissions/sgd-momentum), as a
    workload is found by its name; a path that exists wins. Returned as given when neither is
    found (the loader then names what is missing)."""
    if Path(text).exists() or not text or "/" in text or os.sep in text:
        return text
    shipped_entry = examples() / text
    return str(shipped_entry) if (shipped_entry / "submission.yaml").is_file() else text


def non_empty(what: str) -> Any:
    """argparse type of a path argument, refused where empty with `what` to give instead:
    `--out "$OUT"` with OUT unset was read as '.' (the current folder: '.: is a folder'), a
    leaderboard's '' as no --out at all (the board went to stdout), an operator's '' as
    './submission.yaml'."""
    import argparse

    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"is empty: give {what}")
        return text

    return check


def entry_argument(text: str) -> str:
    """argparse type of an entry argument (`--submission`, `d500 package`): d500.paths.entry's
    folder, or (a bare name) one line saying that neither a folder here nor an example entry
    has that name."""
    import argparse
    if not text.strip():  # `--submission "$E"` with E unset said 'submission.yaml: no such file'
        raise argparse.ArgumentTypeError("is empty: give an entry folder (./my-entry) or an "
                                         "example entry's name (sgd-momentum)")
    found = entry(text)
    if not Path(found).exists() and "/" not in text and os.sep not in text:  # a bare name;
        # a path the loader names as missing itself
        raise argparse.ArgumentTypeError(no_entry(text))
    return found


def no_entry(name: str) -> str:
    """What to say of a bare entry name that is neither a folder here nor an example entry: the
    example entries, and the closest to a typo."""
    from d500.errors import did_you_mean
    names = sorted(p.parent.name for p in examples().glob("*/submission.yaml"))
    hint = did_you_mean(name, names)
    return (f"no entry folder '{name}' here, nor an example entry of that name ("
            + ", ".join(names) + (f"; {hint})" if hint else ")"))


def data_folder(text: str) -> str:
    """argparse type of `--data DIR`: a folder that exists (a mistyped one is one line, even
    where the workload's dataset ships inside d500 and would never read it)."""
    import argparse
    if not Path(text).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"'{text}' is not a folder"
                                         + ("" if Path(text).expanduser().exists()
                                            else " (no such path)"))
    return text


def add_data_option(parser: Any, help: str = "where dataset files are (default $D500_DATA)"
                    ) -> None:
    """The `--data DIR` option of a command that reads datasets: a folder that exists."""
    parser.add_argument("--data", metavar="DIR", type=data_folder, help=help)


def home_named() -> str:
    """$D500_HOME as given, or the default ./d500-results where it is unset or empty
    (`D500_HOME= d500 ...`, `D500_HOME=$UNSET`: the current folder took the ledger and caches)."""
    return os.environ.get("D500_HOME") or "d500-results"


def home() -> Path:
    """The results directory, created on first use; one that cannot be written (a read-only
    disk, another user's folder) is a UsageError naming it."""
    path = Path(home_named()).expanduser().resolve()  # a quoted
    # "~/results" is the user's home, as $D500_DATA's is, not a folder named ~
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        why = "it is a file, not a folder" if path.exists() else unwritable(path, err)
        raise UsageError(f"D500_HOME={path}: cannot use it as the results directory "
                         f"({why})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"D500_HOME={path}: cannot use it as the results directory (not "
                         f"writable: set D500_HOME to a folder of yours)")
    return path


def output_file(path: str | Path, example: str, what: str = "a file name", option: str = "--out",
                endings: tuple[str, ...] = ()) -> Path:
    """The file an option names for output, checked before the work that fills it: a folder is
    a UsageError naming a file in it (`example`, its name), and so is a name not ending in one
    of `endings` where given (what is written there would not be what its name says)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{path}: is a folder; {option} takes {what} (e.g. {path / example})")
    if why := cannot_write(path):  # (`d500 scale --png afile/x.png` was said after the work)
        raise UsageError(f"{option} {path}: cannot write it ({why})")
    if endings and path.suffix.lower() not in endings:
        raise UsageError(f"{path}: {option} writes {Path(example).suffix[1:].upper()}: a file "
                         f"name ending in {' or '.join(endings)} "
                         f"(e.g. {path.with_suffix(Path(example).suffix)})")
    return path


def write_output(path: str | Path, text: str | bytes) -> Path:
    """Write a file the user asked for (--out, --png: text or bytes), creating its folder; a
    path that cannot be written is a UsageError naming it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UsageError(f"{path}: cannot write it ({unwritable(path, err)})") from None
    return path


def looked_in(path: str | Path) -> str:
    """' in CWD' for a relative path that is not there: the folder it was looked for in (a
    script's `cd` elsewhere said only 'model.onnx: no such file'); '' for an absolute one."""
    if Path(path).is_absolute():
        return ""
    try:  # '~/x' quoted: the shell expands an unquoted ~ only
        home = Path(path).expanduser()
    except RuntimeError:  # ~nosuchuser
        home = Path(path)
    return f" in {Path.cwd()}" + (f" (~ was not expanded: the shell expands it unquoted only, "
                                  f"to {home})" if home.is_absolute() else "")


def no_folder(path: str | Path) -> str:
    """Why `path`, given where a folder goes (--rules), is not one: a file there ('no such
    folder' said of a file that plainly exists), or nothing, and where it was looked for."""
    return ("a file, not a folder" if Path(path).exists() else
            f"no such folder{looked_in(path)}")


def cannot_write(path: Path) -> str:
    """Why `path` cannot be written, seen before writing ("" where nothing says so): a file where
    one of its folders goes, an existing file or the nearest existing folder not writable."""
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        return f"{blocking} is a file, not a folder"
    if path.exists():
        return "" if os.access(path, os.W_OK) else "the file is not writable"
    folder = next((p for p in path.parents if p.exists()), Path("."))
    return "" if os.access(folder, os.W_OK | os.X_OK) else f"{folder} is not writable"


def unwritable(path: Path, err: OSError) -> str:
    """Why `path` could not be written: a file where one of its folders goes ('File exists'
    said nothing of which), else the system's words."""
    blocking = next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)
    return f"{blocking} is a file, not a folder" if blocking else str(err.strerror or err)


ENTRY_CACHE = "D500_ENTRY_CACHE"  # set in an entry's process only (d500.children.keep)
_entered: list[str] = []  # (the same, kept where a worker's job replaces its environment)
# a framework's cache folder variable that d500 sets to a folder of `cache`, and the variable
# naming the folder it chose there (not the user: d500.backends.torch.compiled.inductor_cache)
CHOSEN = {"TORCHINDUCTOR_CACHE_DIR": "D500_TORCHINDUCTOR_CACHE_DIR"}


def enter_entry_cache(path: str) -> None:
    """This process is an entry's: its caches go to `path` (d500.children.keep), also after
    its environment is replaced by a job's, and in the processes it starts. A cache folder
    d500 chose in the judge's environment (CHOSEN) is dropped: that folder is hidden from this
    process, and torch made Inductor's as it imported it (a worker's import failed there)."""
    _entered[:] = [path]
    os.environ[ENTRY_CACHE] = path
    for name, chosen in CHOSEN.items():
        if name in os.environ and os.environ[name] == os.environ.get(chosen):
            del os.environ[name], os.environ[chosen]


def entry_cache(home: str) -> str:
    """The one folder of the results directory `home` an entry's process writes: its caches
    (a torch:compiled worker's kernels, an operator host's compiled library), which no judge
    reads."""
    return os.path.join(home, "cache", "entries")


def cache(*parts: str) -> Path:
    """A cache directory under the results directory, or in an entry's process (where
    ENTRY_CACHE names it) under `entry_cache`, the one part of it that process may write
    (d500.children.writable): a judge never reads what an entry wrote (a planted pickle, a
    forged peak FLOP/s, a poisoned Inductor kernel). It needs no more than this folder
    writable."""
    if _entered:
        os.environ[ENTRY_CACHE] = _entered[0]  # (for the processes this one starts)
    path = Path(os.environ.get(ENTRY_CACHE) or os.path.join(
        home_named(), "cache")).expanduser().resolve().joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        home()  # the results directory's own fault, said in one line
        raise
    return path
