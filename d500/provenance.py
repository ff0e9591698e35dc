"""Where and with what a run ran: hardware, OS, package versions, git state, thread count, measured
peak FLOP/s; and how busy the machine was while a run was timed: the load averages at its start
and end, and the CPU time other processes took during it (over 0.25 s at least)
(/proc/stat's busy time less the CPU time of the run's own processes).

No framework is imported: versions come from importlib.metadata, the MPI library's from
`mpichversion`/`ompi_info`. The peak is a short calibrated float32 GEMM, cached per machine and
measured again when it was taken on a loaded machine or is older than PEAK_MAX_AGE.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from d500.errors import UsageError
from d500.paths import PROJECT_ROOT, cache

# Recorded besides every registered framework's distributions (its FRAMEWORK, d500.backends.hooks)
PACKAGES = ("d500", "onnx", "mpi4py", "mpich")
_collected: dict[str, Any] | None = None
_peak_memo: dict[str, dict[str, Any]] = {}  # machine id -> the peak measured by this process

PEAK_MAX_AGE = 7 * 24 * 3600.0  # seconds: an older cached peak is measured again
LOADED_RETRY = 600.0  # seconds: a peak measured on a loaded machine is retried at most this often
# A machine is "loaded" when other processes took more than this share of the cores d500 may use:
# measured during the run (/proc/stat; a run shorter than MIN_DURING is read over MIN_DURING s,
# its tail idle: 10 ms ticks make a 0.25 s reading good to ~0.1 core), else (no /proc/stat) from
# the 1-minute load averages at its start and end (less this process's own share), which lag.
# On 2 cores, half a core.
# An organiser may set another share (D500_LOADED_SHARE); boards apply the share of the process
# that draws them to the figures each run recorded, not the flag the run recorded.
LOADED_SHARE = 0.25
MIN_DURING = 0.25  # seconds: /proc/stat counts in 10 ms ticks; a shorter run is read this long
QUIET_WINDOW = 1.0  # seconds over which others_now() reads what other processes take
LOADAVG = Path("/proc/loadavg")
STAT = Path("/proc/stat")


def collect(refresh: bool = False) -> dict[str, Any]:
    """Everything that identifies the environment of a run (memoised per process)."""
    from d500 import threads

    result = json.loads(json.dumps(facts(refresh)))
    peak = peak_record()
    result["peak_flops"] = peak["flops"]
    result["peak_flops_method"] = "float32 GEMM (numpy), fastest of 7 timed products"
    result["peak_flops_conditions"] = {"measured": peak.get("measured"),
                                       "loaded": peak.get("loaded"),
                                       "load_average": (peak.get("load") or {}).get("start")}
    result["threads"] = threads.recorded()
    return result


def facts(refresh: bool = False) -> dict[str, Any]:
    """`collect`'s facts of the machine and the software, memoised per process: the commands
    they run (git, an MPI library's version) run on the first call (level 3's judge calls it
    before any rank runs the entry's code: such a command's /proc/PID/root showed the judge's
    view of $D500_HOME to a rank)."""
    global _collected
    if _collected is None or refresh:
        _collected = {
            "host": socket.gethostname(),
            "cpu": cpu(),
            "memory_bytes": memory_bytes(),
            "gpus": gpus(),
            "os": f"{platform.system()} {platform.release()}",
            "platform": platform.platform(),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "python_implementation": platform.python_implementation(),
            "packages": versions(),
            "mpi_library": mpi_library(),
            "git": git(),
        }
    return _collected


def digest(provenance: dict[str, Any]) -> str:
    """A stable sha256 of a provenance dict (canonical JSON)."""
    return hashlib.sha256(json.dumps(provenance, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def summary(provenance: dict[str, Any]) -> str:
    """One line: machine and the versions that matter, for leaderboards and listings."""
    cpu_info = provenance.get("cpu", {})
    gib = (provenance.get("memory_bytes") or 0) / 2**30
    gpu = ", ".join(g.get("name", "?") for g in provenance.get("gpus") or []) or "no GPU"
    pk = provenance.get("packages", {})
    from d500.backends import frameworks
    firsts = (next((d for d in fw.distributions() if pk.get(d)), None) for fw in frameworks())
    vers = ", ".join(f"{d} {pk[d]}" for d in dict.fromkeys(firsts) if d)
    peak = provenance.get("peak_flops")
    peak_txt = f", peak {peak / 1e9:.0f} GFLOP/s" if peak else ""
    count = (provenance.get("threads") or {}).get("count")
    peak_txt += f", {count} thread{'s' if count != 1 else ''}" if count else ""
    git_info = provenance.get("git") or {}
    commit = (git_info.get("commit") or "")[:10]
    dirty = "+dirty" if git_info.get("dirty") else ""
    return (f"{cpu_info.get('model', '?')} ×{cpu_info.get('logical_cores', '?')}, {gib:.0f} GiB,"
            f" {gpu}{peak_txt}; {provenance.get('os', '?')}, Python {provenance.get('python')}"
            f"; {vers}" + (f"; git {commit}{dirty}" if commit else ""))


def cpu() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    physical: set[tuple[str, str]] = set()
    try:
        phys_id = "0"
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name":
                model = value
            elif key == "physical id":
                phys_id = value
            elif key == "core id":
                physical.add((phys_id, value))
    except OSError:
        pass
    if sys.platform == "darwin":
        model = _run(["sysctl", "-n", "machdep.cpu.brand_string"]) or model
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    from d500.training.precision import cpu_flags
    # native bf16 arithmetic (avx512_bf16, amx_bf16): without it a bf16 run is emulated, slower
    return {"model": model, "logical_cores": os.cpu_count(), "physical_cores":
            len(physical) or None, "usable_cores": affinity, "bf16": cpu_flags()}


def memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gpus() -> list[dict[str, str]]:
    """NVIDIA GPUs via nvidia-smi when it is installed; an empty list otherwise."""
    if not shutil.which("nvidia-smi"):
        return []
    out = _run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                "--format=csv,noheader"])
    found = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            found.append({"name": parts[0], "memory": parts[1], "driver": parts[2]})
    return found


def versions() -> dict[str, str | None]:
    """Installed versions of the packages that matter (d500's own and every registered
    framework's), without importing them."""
    from d500.backends import frameworks
    found: dict[str, str | None] = {}
    for name in dict.fromkeys([*PACKAGES, *(d for fw in frameworks() for d in fw.distributions())]):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def mpi_library() -> str | None:
    """The MPI library's version line (MPICH's `mpichversion` or Open MPI's `ompi_info`)."""
    bindir = Path(sys.executable).parent
    for tool, args in (("mpichversion", []), ("ompi_info", ["--version"])):
        exe = bindir / tool if (bindir / tool).exists() else shutil.which(tool)
        if exe:
            out = _run([str(exe), *args])
            if out:
                lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
                version = next((ln for ln in lines if "version" in ln.lower()), lines[0])
                return " ".join(version.split())
    return None


def git() -> dict[str, Any]:
    """The commit of the d500 tree and whether it has uncommitted changes."""
    if not (PROJECT_ROOT / ".git").exists() or not shutil.which("git"):
        return {"commit": None, "dirty": None}
    commit = _run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"])
    status = _run(["git", "-C", str(PROJECT_ROOT), "status", "--porcelain",
                   "--untracked-files=no"])
    return {"commit": commit.strip() if commit else None,
            "dirty": None if status is None else bool(status.strip())}


def machine_id() -> str:
    """What identifies the machine for the peak-FLOP/s cache."""
    info = cpu()
    raw = json.dumps([socket.gethostname(), info["model"], info["logical_cores"],
                      info["usable_cores"], platform.machine(), versions().get("numpy")])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def peak_flops(refresh: bool = False) -> float:
    """Measured float32 GEMM FLOP/s of this machine (see peak_record)."""
    return float(peak_record(refresh)["flops"])


def peak_record(refresh: bool = False) -> dict[str, Any]:
    """This machine's peak: {"flops", "measured" (unix time), "load" (load averages around the
    measurement), "loaded", ...}. Calibrated so one product takes ~50 ms, the fastest of 7
    timed products after warm-up (a peak is an upper bound: a low estimate would flatter every
    peak_fraction). Cached per machine under D500_HOME/cache; measured again when the cached
    one is older than PEAK_MAX_AGE, was taken on a loaded machine (at most every
    LOADED_RETRY seconds; the higher of the two is kept while the machine stays loaded), does
    not say how loaded the machine was, or `refresh` asks (an operator beat it)."""
    path = cache("provenance") / f"peak_flops-{machine_id()}.json"
    cached = _read_peak(path)
    now = time.time()
    if cached is not None and not refresh and not _stale(cached, now):
        return cached
    key = machine_id()
    memo = _peak_memo.get(key)  # this process measured it on an idle machine already
    measured = memo if memo is not None and not memo["loaded"] and not refresh else (
        _measure_peak())
    _peak_memo[key] = measured
    keep = measured
    if (cached is not None and measured["loaded"] and cached["flops"] > measured["flops"]
            and now - cached.get("measured", 0) <= PEAK_MAX_AGE):
        # still loaded: the higher peak stays the estimate (a peak is an upper bound), and
        # is retried after LOADED_RETRY
        keep = {**cached, "loaded": cached.get("loaded", True), "checked": now}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(keep))
    os.replace(tmp, path)
    return keep


def _read_peak(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
        record["flops"] = float(record["flops"])
    except (ValueError, KeyError, TypeError, OSError):
        return None
    return record


def _stale(record: dict[str, Any], now: float) -> bool:
    """Whether a cached peak must be measured again."""
    if not isinstance(record.get("measured"), (int, float)) or "loaded" not in record:
        return True  # from before load was recorded: it may have been taken under load
    if now - record["measured"] > PEAK_MAX_AGE:
        return True
    return bool(record["loaded"]) and now - record.get("checked", record["measured"]) > (
        LOADED_RETRY)


def _measure_peak() -> dict[str, Any]:
    watch = LoadWatch()
    flops = _measure_gemm()
    load = watch.finish()
    return {"flops": flops, "measured": time.time(), "dtype": "float32", "load": load,
            "loaded": load["loaded"]}


# ------------------------------------------------------------------ load

def loadavg_text() -> str:
    """The text of /proc/loadavg (tests replace this function with a fake reader)."""
    return LOADAVG.read_text()


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages; None where the system does not say."""
    try:
        return [float(v) for v in loadavg_text().split()[:3]]
    except (OSError, ValueError, IndexError):
        pass
    try:
        return list(os.getloadavg())
    except (OSError, AttributeError):
        return None


def usable_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


_cpu_readings: list[tuple[float, float]] = []  # (monotonic time, this process's CPU seconds)


def own_load() -> float:
    """Cores' worth of CPU this process used over the last minute (or since it started): its own
    share of the 1-minute load average."""
    t = os.times()
    wall, cpu = time.monotonic(), t.user + t.system
    older = [r for r in _cpu_readings if wall - r[0] >= 60.0]
    then = older[-1] if older else (wall - _process_age(), 0.0)
    _cpu_readings[:] = [*older[-1:], *(r for r in _cpu_readings if wall - r[0] < 60.0),
                        (wall, cpu)]
    return max(0.0, (cpu - then[1]) / max(wall - then[0], 1e-3))


def others_load(load: list[float] | None) -> float | None:
    """The load other processes put on the machine: the 1-minute load average less this
    process's own share."""
    return None if load is None else max(0.0, load[0] - own_load())


def loaded_share() -> float:
    """The share of the usable cores other processes may take before a run counts as loaded."""
    text = os.environ.get("D500_LOADED_SHARE")
    if not text:
        return LOADED_SHARE
    try:
        share = float(text)
    except ValueError:
        raise UsageError(f"D500_LOADED_SHARE must be a number (a share of the cores), got "
                         f"{text!r}") from None
    if not share >= 0:
        raise UsageError(f"D500_LOADED_SHARE must be >= 0, got {text!r}")
    return share


def is_loaded(record: dict[str, Any] | None) -> bool:
    """Whether a LoadWatch record says other processes took more than `loaded_share()` of the
    cores: by "during" where the run measured it, else by the load averages' "others"."""
    record = record or {}
    cores = record.get("usable_cores")
    if not isinstance(cores, (int, float)) or cores <= 0:
        return bool(record.get("loaded"))
    during = record.get("during")
    if isinstance(during, (int, float)):
        return during > loaded_share() * cores
    known = [v for v in record.get("others") or [] if isinstance(v, (int, float))]
    return bool(known) and max(known) > loaded_share() * cores


def busy_seconds() -> float | None:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait), or None."""
    try:
        fields = STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def parent_of(pid: int) -> int | None:
    """Process `pid`'s parent (Linux), or None where /proc does not say."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) or None
    except (OSError, IndexError, ValueError):
        return None


def cmdline_of(pid: int) -> bytes | None:
    """Process `pid`'s command line as /proc holds it (NUL after each word, Linux), or None
    where /proc does not say."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def tree_cpu(root: int | None = None) -> float:
    """CPU seconds of this process (or of process `root`, read from /proc), its ended children
    and every live descendant (Linux; this process and its ended children elsewhere): the run's
    own processes, worker and host included."""
    me = skip = os.getpid()
    if root is None or root == me:
        t = os.times()
        total, root = t.user + t.system + t.children_user + t.children_system, me
    else:  # root's line in /proc, and this process's where it lies in root's tree (a judge's)
        total, skip = 0.0, None
    stats = _stats()
    if stats is None:
        return total
    tick = os.sysconf("SC_CLK_TCK")
    return total + sum(stats[pid][1] for pid in _tree(root, stats) if pid != skip) / tick


def _stats() -> dict[int, tuple[int, int]] | None:
    """{pid: (parent, CPU ticks)} of every live process (Linux), or None."""
    try:
        stats = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                stats[int(entry.name)] = (int(fields[1]), sum(int(v) for v in fields[11:15]))
    except OSError:
        return None
    return stats


def _tree(root: int, stats: dict[int, tuple[int, int]]) -> set[int]:
    """Process `root` and its live descendants, of those in `stats`."""
    mine = {root}
    grew = True
    while grew:  # descendants, level by level
        found = {pid for pid, (ppid, _) in stats.items() if ppid in mine and pid not in mine}
        grew = bool(found)
        mine |= found
    return {pid for pid in mine if pid in stats}


def tree_waits(root: int | None = None) -> tuple[float, float] | None:
    """(seconds on a core, seconds runnable but waiting for one) summed over every thread of
    process `root` (default: this one) and its live descendants, from the scheduler's own
    nanosecond counts (/proc/PID/task/TID/schedstat, Linux); None where it does not say."""
    stats = _stats()
    if stats is None:
        return None
    ran = waited = 0.0
    seen = False
    for pid in _tree(os.getpid() if root is None else root, stats):
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                run, wait = (task / "schedstat").read_text().split()[:2]
            except (OSError, ValueError):
                continue
            ran, waited, seen = ran + int(run) / 1e9, waited + int(wait) / 1e9, True
    return (ran, waited) if seen else None


def others_now(seconds: float = QUIET_WINDOW) -> float | None:
    """Cores' worth of CPU other processes (outside this process's tree) take now, over a
    window of `seconds`; None where /proc/stat does not say."""
    watch = LoadWatch()
    time.sleep(seconds)
    return watch.finish().get("during")


def wait_for_quiet(limit: float, note: Any = None) -> float | None:
    """Wait, up to `limit` seconds, until other processes take at most `loaded_share()` of the
    usable cores (`note(text)` says why it waits); the last reading (None: not measurable)."""
    cores, start = usable_cores(), time.monotonic()
    while True:
        others = others_now()
        if others is None or others <= loaded_share() * cores:
            return others
        left = limit - (time.monotonic() - start)
        if left <= 0:
            return others
        if note is not None:
            note(f"waiting for a quiet machine: other processes take {others:.1f} of {cores} "
                 f"cores ({left:.0f} s left)")


class LoadWatch:
    """How busy the machine was around a timed piece of work: made when it starts, `finish()`
    when it ends. The work ran on a loaded machine when other processes took more than
    `loaded_share()` of the usable cores (is_loaded)."""

    def __init__(self, root: int | None = None) -> None:
        """`root`: the process whose tree is the work's own (default: this process's), as a
        level-3 judge names its job's ranks on this host (d500.distributed.judge)."""
        self.start = load_average()
        self.start_others = others_load(self.start)
        self.root = root
        self.restart()

    def restart(self) -> None:
        """The timed part starts now: "during" and "own_cpu" are measured from here on (a
        training run's clock starts after its setup, which can take 30 times what it times)."""
        self.wall, self.busy, self.cpu = time.monotonic(), busy_seconds(), tree_cpu(self.root)
        self.waits, self.marked = tree_waits(self.root), None

    def mark(self) -> None:
        """The timed part's threads are read now, while they live: "waits" is measured up to
        here (a level-2 run's worker ends before `finish`, and an ended thread takes its
        scheduler counts with it: its reproductions recorded no waits at all)."""
        self.marked = tree_waits(self.root)

    def finish(self, job_load: float = 0.0) -> dict[str, Any]:
        """{"start", "end" (1/5/15-minute load averages), "others" (other processes' load at
        start and end), "during" (cores' worth of CPU other processes took during the run, or
        the first MIN_DURING s from its start; "own_cpu", the CPU seconds the `root`'s tree took
        over those "wall" seconds; "waited", the share of the time its threads were runnable
        that they waited for a core, of "waits" [seconds on a core, seconds waiting] summed over
        its threads, tree_waits, up to `mark` where called), "usable_cores", "loaded"}. `job_load`
        (cores): what this job's processes outside the tree use on this host (parallel tuning's
        other ranks), taken out of the others'."""
        end = load_average()
        # rounded before deciding, so "loaded" follows from the figures the record shows
        pair = [None if v is None else round(max(0.0, v - job_load), 2)
                for v in (self.start_others, others_load(end))]
        cores = usable_cores()
        out = {"start": self.start, "end": end, "others": pair, "usable_cores": cores}
        if self.busy is not None:  # a short run is read over MIN_DURING s, its tail idle
            time.sleep(max(0.0, MIN_DURING - (time.monotonic() - self.wall)))
        wall, busy = time.monotonic() - self.wall, busy_seconds()
        if self.busy is not None and busy is not None:
            own = tree_cpu(self.root) - self.cpu
            others = (busy - self.busy - own) / wall - job_load
            out["during"] = round(min(float(cores), max(0.0, others)), 2)  # ticks: +-2 of them
            out["own_cpu"], out["wall"] = round(own, 2), round(wall, 2)  # the work's own tree
        waits = tree_waits(self.root) if self.marked is None else self.marked
        if self.waits is not None and waits is not None:  # threads that ended took theirs
            ran, waited = (max(0.0, b - a) for a, b in zip(self.waits, waits, strict=True))
            if ran + waited > 0:  # the share of its runnable time the tree waited for a core
                out["waited"] = round(waited / (ran + waited), 3)
                out["waits"] = [round(ran, 4), round(waited, 4)]  # seconds: on a core, waiting
        if job_load:
            out["job_load"] = round(job_load, 2)
        out["loaded"] = is_loaded(out)
        return out


def _process_age() -> float:
    """Seconds since this process started (Linux); 60 elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(uptime - ticks / os.sysconf("SC_CLK_TCK"), 1e-3)
    except (OSError, ValueError, IndexError):
        return 60.0


def _measure_gemm() -> float:
    """The GEMM on every usable core, whatever thread count runs are timed at (--threads): the
    peak is the machine's."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=usable_cores(), user_api="blas"):
        return _gemm_flops()


def _gemm_flops() -> float:
    import numpy as np

    rng = np.random.default_rng(0)
    n = 512
    while True:  # grow until one product takes ~50 ms (or n hits the cap)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        a @ b
        t0 = time.perf_counter()
        a @ b
        elapsed = time.perf_counter() - t0
        if elapsed > 0.05 or n >= 4096:
            break
        n *= 2
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / min(times)


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None
