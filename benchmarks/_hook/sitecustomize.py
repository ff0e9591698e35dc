"""benchmarks/isolation_trace.py's hook, loaded by every Python process started with this folder
on PYTHONPATH: multiprocessing's pipe messages timed (D500_TRACE: a folder, a file per
process) and, with D500_SPIN_S, a busy-poll of that many seconds before a pipe read blocks."""

import os
import time
from multiprocessing import connection

SPIN = float(os.environ.get("D500_SPIN_S", "0"))
TRACE = os.environ.get("D500_TRACE")
_poll, _recv_bytes, _send = (connection.Connection.poll, connection.Connection.recv_bytes,
                             connection.Connection.send)
_recv = connection.Connection.recv
_log = []


def _spin(conn):
    end = time.perf_counter() + SPIN
    while time.perf_counter() < end:
        if _poll(conn, 0):
            return True
    return False


def _note(what, message):
    if not _log:
        _log.append(open(os.path.join(TRACE, f"{os.getpid()}.tsv"), "a", buffering=1))
    tag = message[0] if isinstance(message, tuple) and message and isinstance(
        message[0], str) else type(message).__name__
    _log[0].write(f"{what}\t{tag}\t{time.perf_counter():.7f}\n")


def poll(self, timeout=0.0):
    if SPIN <= 0 or (timeout is not None and timeout <= 0):
        return _poll(self, timeout)
    return _spin(self) or _poll(self, None if timeout is None else max(0.0, timeout - SPIN))


def recv(self):
    if SPIN > 0:
        _spin(self)
    message = _recv(self)
    if TRACE:
        _note("recv", message)
    return message


def recv_bytes(self, maxlength=None):
    if SPIN > 0:
        _spin(self)
    data = _recv_bytes(self, maxlength)
    if TRACE:
        _note("recv", ("bytes",))
    return data


def send(self, obj):
    if TRACE:
        _note("send", obj)
    return _send(self, obj)


if TRACE or SPIN > 0:
    connection.Connection.poll, connection.Connection.recv = poll, recv
    connection.Connection.recv_bytes, connection.Connection.send = recv_bytes, send
