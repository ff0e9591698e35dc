"""Running a command with its stderr on a pseudo-terminal, and the lines a terminal would show."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import termios
import threading
from pathlib import Path


def on_terminal(command: list[str], env: dict, cwd: Path, *,
                stdout: bool = False) -> tuple[int, str, str]:
    """`command` with its stderr on a pseudo-terminal (read as it comes, so the terminal never
    fills) and its stdout read where `stdout`, else discarded: (exit code, stdout, stderr)."""
    master, slave = os.openpty()
    # the terminal's size, as a terminal window has one: `env`'s COLUMNS wide (a new pty says
    # 0, read as 80, and d500's spinner cuts its line to the terminal's width)
    fcntl.ioctl(slave, termios.TIOCSWINSZ,
                struct.pack("HHHH", 24, int(env.get("COLUMNS", "80")), 0, 0))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
                            stderr=slave, env=env, cwd=cwd)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # the last writer closed it
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    out = proc.communicate(timeout=300)[0] or b""
    reader.join(timeout=30)
    os.close(master)
    return proc.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


def screen(text: str) -> list[str]:
    """The lines a terminal shows after `text`: carriage returns, newlines, line erases and
    cursor-ups applied (other escapes, colours, dropped)."""
    lines, row, col, i = [""], 0, 0, 0
    while i < len(text):
        escape = re.match(r"\x1b\[(\??)(\d*)([A-Za-z])", text[i:])
        if escape:
            if escape[3] == "K":
                lines[row] = "" if escape[2] == "2" else lines[row][:col]
            elif escape[3] == "A" and not escape[1]:
                row = max(0, row - int(escape[2] or 1))
            i += escape.end()
            continue
        char, i = text[i], i + 1
        if char == "\r":
            col = 0
        elif char == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        else:
            line = lines[row].ljust(col)
            lines[row], col = line[:col] + char + line[col + 1:], col + 1
    return lines
