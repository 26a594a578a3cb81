"""Shared helpers of the benchmarks: worker processes, percentiles, progress, machine facts.

Workers are real ``celery worker`` processes (prefork), each in its own process group on its
own queue, started like ``tests/e2e/conftest.py`` starts them, and stopped by group id.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; raise TimeoutError past ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Worker:
    """A ``celery worker`` subprocess in its own process group."""

    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        """The main process id."""
        return self.proc.pid

    def text(self) -> str:
        """What the worker logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def children(self) -> list[int]:
        """The pool processes (direct children of the main process)."""
        found: list[int] = []
        for task in Path(f"/proc/{self.pid}/task").glob("*/children"):
            found.extend(int(pid) for pid in task.read_text().split())
        return sorted(found)

    def stop(self, timeout: float = 30.0) -> None:
        """Warm shutdown (SIGTERM to the group); SIGKILL if it does not stop in time."""
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def start_worker(app_module: str, queue: str, env: dict[str, str], log: Path, ready: Path,
                 concurrency: int = 2, loglevel: str = "WARNING") -> Worker:
    """Start a prefork worker on ``queue`` and wait until it wrote ``ready``."""
    ready.unlink(missing_ok=True)
    handle = open(log, "wb")  # noqa: SIM115 - the child owns it until it exits
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", app_module, "worker", "--pool", "prefork",
         "-c", str(concurrency), "-Q", queue, "-n", f"bench-{queue}@%h", "-l", loglevel,
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)},
        stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
    )
    handle.close()
    worker = Worker(proc, log)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 90, "worker ready")
        wait_until(lambda: len(worker.children()) >= concurrency or proc.poll() is not None, 30,
                   "pool processes")
    except TimeoutError:
        worker.stop()
        raise
    if proc.poll() is not None:
        raise RuntimeError(f"worker exited at start:\n{worker.text()[-3000:]}")
    return worker


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (VmRSS), 0 when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), nearest-rank on the sorted values; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: Iterable[float]) -> float:
    """The median; NaN when empty."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


class Progress:
    """One status line, redrawn in place on a terminal and at most every few seconds otherwise."""

    def __init__(self, every: float = 2.0) -> None:
        self.tty = sys.stderr.isatty()
        self.every = 0.2 if self.tty else every
        self._last = 0.0

    def due(self) -> bool:
        """True when a new line would be shown now (to skip computing one that would not)."""
        return self.tty or time.monotonic() - self._last >= self.every

    def show(self, text: str, force: bool = False) -> None:
        """Show ``text`` if enough time passed since the last line (or ``force``)."""
        now = time.monotonic()
        if not force and now - self._last < self.every:
            return
        self._last = now
        if self.tty:
            sys.stderr.write("\r\033[K" + text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        """End the status line."""
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    for command, key in ((["lscpu"], "lscpu"), (["free", "-g"], "free_g")):
        try:
            info[key] = subprocess.run(command, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            info[key] = None
    info["model"] = _lscpu_field(info.get("lscpu") or "", "Model name")
    try:
        from redis.utils import HIREDIS_AVAILABLE

        info["redis_py_hiredis"] = HIREDIS_AVAILABLE
    except ImportError:
        info["redis_py_hiredis"] = None
    return info


def _lscpu_field(text: str, name: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return None


def git_commit() -> str | None:
    """The commit the benchmark ran on (with ``-dirty`` when the tree has changes)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "") if head else None


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# ---------------------------------------------------------------------- profiling (py-spy)

PY_SPY = Path(sys.executable).with_name("py-spy")
# Where a task sample's time goes: the first rule (in this order) whose needle is in any frame.
_IO_LEAVES = ("send_packed_command", "_read_from_socket", "sendall", "recv", "Connection.wait",
              "_send_query_prepared", "_read_exactly", "select", "poll")
CATEGORIES = (
    ("broker publish (incl. its I/O)", ("Task.apply_async", "Celery.send_task")),
    ("bench task bodies (no-op steps, chain finish mark)", ("bench/bench_app.py",)),
    ("effect journal (store calls)", ("EffectRecorder.",)),
    ("store: waiting on the server", ()),  # decided from the leaf, see _category
    ("store: client Python", ("celery_sagas/stores/",)),
    ("saga engine (Python)", ("celery_sagas/",)),
    ("celery/kombu/other", ()),
)


@dataclass
class Spy:
    """py-spy recorders attached to some processes."""

    procs: list[subprocess.Popen[bytes]]
    outputs: dict[int, Path]


def start_py_spy(pids: dict[int, str], prefix: Path, rate: int) -> Spy:
    """Record each of ``pids`` (pid -> role) with py-spy (idle included) until ``stop_py_spy``."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    procs, outputs = [], {}
    for pid, role in pids.items():
        out = prefix.with_name(f"{prefix.name}-{role}-{pid}.txt")
        outputs[pid] = out
        procs.append(subprocess.Popen(
            [str(PY_SPY), "record", "--pid", str(pid), "--idle", "--format", "raw", "--nonblocking",
             "--full-filenames", "--rate", str(rate), "-o", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
    time.sleep(1.0)  # let py-spy attach before the measured work starts
    return Spy(procs, outputs)


def stop_py_spy(spy: Spy) -> None:
    """Stop the recorders (SIGINT makes py-spy write its output)."""
    for proc in spy.procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in spy.procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _frame(raw: str) -> str:
    """``func (/path/to/pkg/mod.py:12)`` -> ``func (pkg/mod.py)``, paths shortened to packages."""
    name, _, where = raw.rpartition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3."):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker.startswith("/lib"):
                path = path.split("/", 1)[1] if "/" in path else path
            break
    else:
        path = path.split("/main/", 1)[-1]
    return f"{name} ({path})"


def read_stacks(path: Path) -> list[tuple[list[str], int]]:
    """The collapsed stacks of a py-spy raw file: (frames root first, samples)."""
    stacks = []
    if not path.exists():
        return stacks
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";") if f and not f.startswith("process ")]
        stacks.append((frames, int(count)))
    return stacks


def _category(frames: list[str]) -> str:
    """The category of one task sample (frames root first, below the tracer)."""
    for name, needles in CATEGORIES[:3]:
        if any(n in f for f in frames for n in needles):
            return name
    if any("celery_sagas/stores/" in f for f in frames):
        leaf = frames[-1] if frames else ""
        return CATEGORIES[3][0] if any(n in leaf for n in _IO_LEAVES) else CATEGORIES[4][0]
    if any("celery_sagas/" in f for f in frames):
        return CATEGORIES[5][0]
    return CATEGORIES[6][0]


def profile_summary(spy: Spy, rate: int, items: int, top: int = 25) -> dict[str, Any]:
    """Where the pool's task time went: totals, categories, top inclusive and self frames.

    Only stacks inside ``fast_trace_task`` count (the pool's idle loop does not); frames are
    ranked on the part of the stack below it, and frames present in (nearly) every task sample
    (the tracer itself) are left out of the inclusive ranking.
    """
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    categories: dict[str, int] = {}
    task = total = 0
    for path in spy.outputs.values():
        if "-main-" in path.name:
            continue
        for frames, count in read_stacks(path):
            total += count
            marks = [i for i, f in enumerate(frames) if f.startswith("fast_trace_task ")]
            if not marks:
                continue
            below = frames[marks[0] + 1:]
            task += count
            for frame in set(below):
                inclusive[frame] = inclusive.get(frame, 0) + count
            own[frames[-1]] = own.get(frames[-1], 0) + count
            category = _category(below)
            categories[category] = categories.get(category, 0) + count

    def ranked(table: dict[str, int]) -> list[dict[str, Any]]:
        rows = sorted(((k, v) for k, v in table.items() if v < 0.995 * task), key=lambda kv: -kv[1])
        return [{"frame": k, "samples": v, "percent_of_task": round(100 * v / task, 1) if task else 0}
                for k, v in rows[:top]]

    return {
        "pool_samples": total,
        "task_samples": task,
        "task_ms_per_item": round(task / rate * 1000 / items, 3) if items else None,
        "categories_percent": {k: round(100 * v / task, 1) for k, v in
                               sorted(categories.items(), key=lambda kv: -kv[1])} if task else {},
        "categories_ms_per_item": {k: round(v / rate * 1000 / items, 2) for k, v in
                                   sorted(categories.items(), key=lambda kv: -kv[1])} if items else {},
        "top_inclusive": ranked(inclusive),
        "top_self": ranked(own),
        "files": [str(p) for p in spy.outputs.values()],
    }
