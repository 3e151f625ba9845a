"""The benchmarks' readings of the machine: how long processes waited for a core."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.stack import runqueue_seconds

pytestmark = pytest.mark.skipif(
    not Path(f"/proc/{os.getpid()}/schedstat").exists(),
    reason="the kernel keeps no scheduler statistics here",
)

SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"


def test_two_spinning_processes_on_one_core_wait_for_it() -> None:
    cpu = min(os.sched_getaffinity(0))
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    try:
        for p in spinners:
            os.sched_setaffinity(p.pid, {cpu})
        pids = [p.pid for p in spinners]
        before = runqueue_seconds(pids)
        time.sleep(1.0)
        after = runqueue_seconds(pids)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert before is not None and after is not None
    # One core for two processes that never block: together they waited about a
    # second in that second (each half of it); well above what an idle core gives.
    assert after - before > 0.3


def test_an_ended_process_counts_for_nothing() -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    assert runqueue_seconds([ended.pid]) is None
    own = runqueue_seconds([os.getpid(), ended.pid])
    assert own is not None and own >= 0
