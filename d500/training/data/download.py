"""Download a dataset's published files (urllib), each checked against its sha256 before it is
moved into place, so an interrupted, partial or wrong download never replaces a good file.

A file streams into a hidden temporary file in the target folder; only when its digest is the
published one is it renamed over the target (`os.replace`, atomic within one file system). A
target that is already good is not downloaded again. The download location is the registry's
default, or $D500_<NAME>_URL (e.g. D500_MNIST_URL), or the `url_base` argument, in rising
priority; each file is fetched from `url_base/<file name>`.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from d500 import __version__
from d500.errors import DatasetError
from d500.training.data import registry

# progress(file name, bytes so far, bytes expected)
Progress = Callable[[str, int, int], None]


@dataclass
class Fetched:
    """What download() did with one file: "present" (already good) or "downloaded"."""

    path: Path
    status: str
    size: int


def location(spec: registry.Spec, given: str | None = None) -> str:
    """The download location: `given`, else $D500_<NAME>_URL, else the registry's default."""
    return (given or os.environ.get(spec.url_env) or spec.url_base).rstrip("/")


def _sync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform without directory handles: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fetch(url: str, target: Path, file: registry.File, progress: Progress | None = None,
          timeout: float = 60.0) -> int:
    """Stream `url` into a temporary file beside `target`; rename it to `target` only if it is
    `file.size` bytes with sha256 `file.sha256`. Returns the bytes written. Any failure is a
    DatasetError naming the URL, and leaves `target` as it was."""
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".part", dir=target.parent)
    done = 0
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            request = urllib.request.Request(url, headers={"User-Agent": f"d500/{__version__}"})
            with urllib.request.urlopen(request, timeout=timeout) as response:
                while block := response.read(1 << 16):
                    done += len(block)
                    if done > file.size:
                        raise DatasetError(f"{url}: more than the {file.size} bytes of the "
                                           f"published {file.name}; {target} left as it was")
                    h.update(block)
                    out.write(block)
                    if progress:
                        progress(file.name, done, file.size)
                announced = response.headers.get("Content-Length", "")
                if announced.isdigit() and done < int(announced):
                    raise DatasetError(f"{url}: the connection closed after {done} of the "
                                       f"{announced} bytes announced; {target} left as it was")
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != file.sha256:
            raise DatasetError(f"{url}: got {done} bytes with sha256 {h.hexdigest()}, not the "
                               f"published {file.sha256} ({file.size} bytes) of {file.name}; "
                               f"{target} left as it was")
        os.replace(tmp, target)
        _sync_folder(target.parent)
        return done
    except urllib.error.HTTPError as err:
        raise DatasetError(f"{url}: HTTP {err.code} {err.reason}; {target} left as it "
                           f"was") from None
    except urllib.error.URLError as err:
        raise DatasetError(f"{url}: cannot download it ({err.reason}); {target} left as it "
                           f"was") from None
    except (OSError, http.client.HTTPException) as err:
        raise DatasetError(f"{url}: download failed after {done} bytes "
                           f"({type(err).__name__}: {err}); {target} left as it was") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def download(name: str, to: str | os.PathLike, url_base: str | None = None,
             progress: Progress | None = None, timeout: float = 60.0) -> list[Fetched]:
    """Every published file of dataset `name` into `to`/`name`/ (the layout `load()` reads),
    skipping files already there with the right digest."""
    if name == "digits":
        raise DatasetError("digits is embedded in d500: there is nothing to download")
    spec = registry.spec(name)
    folder = Path(to).expanduser() / spec.name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        from d500.paths import unwritable  # --to naming a file: said so, not 'Not a directory'
        raise DatasetError(f"{folder}: cannot create it ({unwritable(folder, err)})") from None
    base = location(spec, url_base)
    fetched = []
    for file in spec.files:
        target = folder / file.name
        if target.is_file() and registry.digest(target) == file.sha256:
            fetched.append(Fetched(target, "present", target.stat().st_size))
            continue
        size = fetch(f"{base}/{file.name}", target, file, progress, timeout)
        fetched.append(Fetched(target, "downloaded", size))
    return fetched
