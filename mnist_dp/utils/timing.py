"""Where a task's time goes: process start and imports, σ calibration, the first step (graph
compilation, and what a framework makes before its steps: the first layer's patch Grams), training,
predict, scoring, saving; and the task process's peak memory.

Every Substra task is a new Python process that imports its framework, so the time before a function
body starts is measured from the process's own start (Linux `/proc`). A task logs one line with its
phases; when MNIST_DP_TIMINGS names a file, it also appends them there as one JSON line
(`benchmarks/benchmark.py` reads it; Substra's subprocess mode passes the environment on to tasks,
its docker mode does not).
"""
from __future__ import annotations

import json
import logging
import os
import resource
import time

TIMINGS_VARIABLE = "MNIST_DP_TIMINGS"
log = logging.getLogger("substratools.mnist_dp")

_task: dict | None = None  # the running task's record: one task per process


def process_age() -> float | None:
    """Seconds since this process started, or None where /proc is missing."""
    try:
        with open("/proc/self/stat") as stat:
            # after the command name, which may hold spaces
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as uptime:
            now = float(uptime.read().split()[0])
    except OSError:
        return None
    # field 22 of stat: start, in ticks since boot
    return now - int(fields[19]) / os.sysconf("SC_CLK_TCK")


def begin_task(function: str, **labels) -> None:
    """Start timing a task at the top of its function body: what ran before is the phase "start"."""
    global _task
    _task = {"function": function, **labels, "phases": {"start": process_age()},
             "_last": time.monotonic()}


def mark(phase: str) -> None:
    """Add the time since the previous mark to `phase` (a no-op outside a task, e.g. in tests)."""
    if _task is None:
        return
    now = time.monotonic()
    _task["phases"][phase] = _task["phases"].get(phase, 0.0) + now - _task.pop("_last")
    _task["_last"] = now


def end_task(last_phase: str, **labels) -> dict | None:
    """Close the task's last phase; log the record and append it to $MNIST_DP_TIMINGS if set."""
    global _task
    if _task is None:
        return None
    mark(last_phase)
    record = {key: value for key, value in _task.items() if key != "_last"}
    record.update(labels, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    _task = None
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in record["phases"].items()
                       if seconds is not None)
    log.info("time: %s; peak memory %.0f MB", phases, record["peak_rss_mb"])
    path = os.environ.get(TIMINGS_VARIABLE)
    if path:
        # one short line per write: appends from several tasks do not mix
        with open(path, "a") as timings:
            timings.write(json.dumps(record) + "\n")
    return record
