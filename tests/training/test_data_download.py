"""`download()` against a loopback HTTP server (http.server in a thread) serving generated files:
digests checked, nothing fetched twice, and a wrong, short, cut, overlong or interrupted
download never replaces a file or leaves a temporary one behind."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from d500.errors import DatasetError
from d500.training import data
from d500.training.data import download, registry

from .test_data_files import adopt, make_idx


class _Handler(BaseHTTPRequestHandler):
    """Serves server.files at /datasets/<name>; server.modes[name] spoils a file:
    "wrong" (same length, other bytes), "short" (half, honestly announced), "cut" (half of an
    announced whole, then the connection drops), "long" (the file and 100 bytes more)."""

    def do_GET(self) -> None:
        folder, _, name = self.path.rpartition("/")
        self.server.hits.append(self.path)  # type: ignore[attr-defined]
        body = self.server.files.get(name) if folder == "/datasets" else None  # type: ignore
        if body is None:
            self.send_error(404, "Not Found")
            return
        mode = self.server.modes.get(name, "good")  # type: ignore[attr-defined]
        announced = len(body)
        if mode == "wrong":
            body = bytes(b ^ 0xFF for b in body[:64]) + body[64:]
        elif mode == "short":
            body = body[: len(body) // 2]
            announced = len(body)
        elif mode == "cut":
            body = body[: len(body) // 2]
        elif mode == "long":
            body = body + b"\0" * 100
            announced = len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(announced))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.files, httpd.modes, httpd.hits = {}, {}, []  # type: ignore[attr-defined]
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}/datasets"  # type: ignore
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture
def published(tmp_path, monkeypatch, server):
    """Generated MNIST files adopted as the published release and served by `server`."""
    monkeypatch.delenv("D500_DATA", raising=False)
    monkeypatch.delenv("D500_MNIST_URL", raising=False)
    source = tmp_path / "published"
    make_idx(source, seed=7)
    spec = adopt(monkeypatch, "mnist", source)
    server.files.update({f.name: (source / f.name).read_bytes() for f in spec.files})
    return source


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_download_checks_places_and_does_not_fetch_twice(tmp_path, server, published):
    seen: list[tuple[str, int, int]] = []
    fetched = download.download("mnist", tmp_path / "data", server.url,
                                progress=lambda *a: seen.append(a))
    folder = tmp_path / "data" / "mnist"
    assert [f.status for f in fetched] == ["downloaded"] * 4
    for item in fetched:
        assert item.path.parent == folder
        assert item.path.read_bytes() == (published / item.path.name).read_bytes()
    assert len(server.hits) == 4 and all(h.startswith("/datasets/") for h in server.hits)
    assert leftovers(folder) == []
    last = {name: (done, total) for name, done, total in seen}
    assert all(done == total for done, total in last.values()) and len(last) == 4
    assert len(data.load("mnist", tmp_path / "data").y) == 60

    again = download.download("mnist", tmp_path / "data", server.url)
    assert [f.status for f in again] == ["present"] * 4 and len(server.hits) == 4


def test_the_url_comes_from_the_flag_then_the_environment(tmp_path, server, published,
                                                          monkeypatch):
    monkeypatch.setenv("D500_MNIST_URL", server.url + "/")
    assert len(download.download("mnist", tmp_path / "a")) == 4
    monkeypatch.setenv("D500_MNIST_URL", server.url + "/nothing-here/x/")
    with pytest.raises(DatasetError, match="HTTP 404"):
        download.download("mnist", tmp_path / "b")
    assert len(download.download("mnist", tmp_path / "c", url_base=server.url)) == 4
    assert download.location(registry.REGISTRY["mnist"], None).endswith("/nothing-here/x")


@pytest.mark.parametrize("mode, message", [
    ("wrong", "with sha256 .* not the published"),
    ("short", "not the published"),
    ("cut", r"the connection closed after \d+ of the \d+ bytes announced"),
    ("long", "more than the .* bytes of the published"),
])
def test_a_bad_download_never_replaces_a_file(tmp_path, server, published, mode, message):
    name = "train-images-idx3-ubyte.gz"
    server.modes[name] = mode
    folder = tmp_path / "data" / "mnist"
    with pytest.raises(DatasetError, match=message) as err:  # nothing there before
        download.download("mnist", tmp_path / "data", server.url)
    assert "\n" not in str(err.value) and f"{server.url}/{name}" in str(err.value)
    assert not (folder / name).exists() and leftovers(folder) == []

    stale = b"an older, damaged copy"
    (folder / name).write_bytes(stale)  # a bad file is refetched, but not by a bad download
    with pytest.raises(DatasetError, match=message):
        download.download("mnist", tmp_path / "data", server.url)
    assert (folder / name).read_bytes() == stale and leftovers(folder) == []

    good = (published / name).read_bytes()  # a good file survives a bad fetch
    (folder / name).write_bytes(good)
    spec = registry.REGISTRY["mnist"]
    with pytest.raises(DatasetError, match=message):
        download.fetch(f"{server.url}/{name}", folder / name, spec.file(name))
    assert (folder / name).read_bytes() == good and leftovers(folder) == []

    server.modes.clear()  # the server mends: the stale file is replaced, the good one kept
    (folder / name).write_bytes(stale)
    download.download("mnist", tmp_path / "data", server.url)
    assert (folder / name).read_bytes() == good


def test_an_interrupted_download_leaves_nothing(tmp_path, server, published):
    def interrupt(name: str, done: int, total: int) -> None:
        if done > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        download.download("mnist", tmp_path / "data", server.url, progress=interrupt)
    folder = tmp_path / "data" / "mnist"
    assert list(folder.iterdir()) == []


def test_unreachable_servers_and_embedded_data_are_one_line_errors(tmp_path, published):
    with pytest.raises(DatasetError, match=r"http://127.0.0.1:9/x/train-images-idx3-ubyte.gz: "
                                           r"cannot download it"):
        download.download("mnist", tmp_path, "http://127.0.0.1:9/x", timeout=5)
    with pytest.raises(DatasetError, match="digits is embedded in d500"):
        download.download("digits", tmp_path)
    with pytest.raises(DatasetError, match="unknown dataset 'svhn'"):
        download.download("svhn", tmp_path)


def test_to_naming_a_file_says_it_is_a_file(tmp_path):
    # `d500 data download mnist --to notes.txt` said '.../notes.txt/mnist: cannot create it
    # (Not a directory)'
    (tmp_path / "notes.txt").write_text("mine\n")
    with pytest.raises(DatasetError, match=f"cannot create it \\({tmp_path / 'notes.txt'} is a "
                                           f"file, not a folder\\)"):
        download.download("mnist", tmp_path / "notes.txt")
