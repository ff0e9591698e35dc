"""`d500 data list|download`: the level-2 datasets, their files and whether a data directory has
them; downloading them (checked) on a machine that reaches the internet."""

from __future__ import annotations

import json
import sys
from typing import Any

from d500 import paths
from d500.cli import ArgumentParser, stdout_console
from d500.errors import UsageError

DOWNLOAD_HELP = """Download the published files of a dataset into DIR/NAME/ (the layout
`--data DIR` reads). Each file streams into a temporary file beside its target and is moved into
place only when its sha256 is the published one, so a partial or wrong download never replaces
a good file; a file already there with the right digest is not downloaded again. Files are
fetched from URL/<file name>: URL is --url-base, else $D500_<NAME>_URL (e.g. D500_MNIST_URL,
D500_FASHION_MNIST_URL, D500_CIFAR10_URL), else the dataset's usual location."""


def main(argv: list[str], prog: str = "d500 data") -> int:
    from d500.training.data import registry
    parser = ArgumentParser(prog=prog, description="Level 2: the training datasets.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p_list = sub.add_parser("list", help="the datasets, their files and which are present")
    paths.add_data_option(p_list, help="a data directory to look in (default: $D500_DATA)")
    p_list.add_argument("--json", action="store_true", help="print the table as JSON")
    p_get = sub.add_parser("download", help="download a dataset's files, checked",
                           description=DOWNLOAD_HELP)
    p_get.add_argument("name", choices=list(registry.REGISTRY), metavar="NAME",
                       help=", ".join(registry.REGISTRY))
    p_get.add_argument("--to", "--data", dest="to", metavar="DIR",  # --data: as list, train
                       help="the data directory (default: $D500_DATA)")
    p_get.add_argument("--url-base", metavar="URL", help="where to fetch the files from")
    p_get.add_argument("--timeout", type=float, default=60.0,
                       help="seconds without data before giving up (default 60)")
    args = parser.parse_args(argv)
    if args.command == "list":
        return _list(args)
    return _download(args)


def _rows(data_dir: Any) -> list[dict]:
    from d500.training.data import digits, registry
    rows = [{"dataset": "digits", "file": digits.FILE, "sha256": digits.sha256(),
             "bytes": len(digits.raw_bytes()), "status": "embedded"}]
    for spec in registry.REGISTRY.values():
        for file in spec.files:
            status = registry.status(spec, file.name, data_dir) if data_dir else "-"
            rows.append({"dataset": spec.name, "file": file.name, "sha256": file.sha256,
                         "bytes": file.size, "status": status})
    return rows


def _list(args: Any) -> int:
    from rich.table import Table

    from d500.training.data import registry
    data_dir = registry.data_dir(args.data)
    rows = _rows(data_dir)
    if args.json:
        print(json.dumps({"data_dir": str(data_dir) if data_dir else None, "files": rows},
                         indent=2))
        return 0
    where = f"in {data_dir}" if data_dir else "(no --data DIR or D500_DATA: presence not checked)"
    table = Table(title=f"level-2 datasets {where}")
    for header in ("dataset", "file", "bytes", "sha256", "status"):
        table.add_column(header, justify="right" if header == "bytes" else "left")
    for row in rows:
        table.add_row(row["dataset"], row["file"], f"{row['bytes']:,}",
                      row["sha256"][:16] + "…", row["status"])
    stdout_console().print(table)
    return 0


def _download(args: Any) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from d500.training.data import download, registry
    to = registry.data_dir(args.to)
    if to is None:
        raise UsageError("give --to DIR (or set D500_DATA)")
    if not args.timeout > 0:
        raise UsageError(f"--timeout: expected a positive number of seconds, got {args.timeout}")
    console = Console(stderr=True)
    tasks: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=console,
                  disable=not console.is_terminal) as bar:
        def progress(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=done)

        fetched = download.download(args.name, to, args.url_base, progress, args.timeout)
    for item in fetched:
        what = "already present, sha256 ok" if item.status == "present" else "downloaded, sha256 ok"
        print(f"{item.path}  {item.size:,} bytes  {what}")
    print(f"{args.name}: ready; train with --data {to}", file=sys.stderr)
    return 0
