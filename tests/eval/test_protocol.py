"""Runner frames: length-prefixed msgpack over pipes, strict types, deadlines and EOF."""
from __future__ import annotations

import os
import time

import pytest

from specgen.eval.protocol import FrameError, FrameReader, write_frame
from specgen.messages import EvalOptions, RunJob, RunnerReady


def test_frames_round_trip_and_split_reads() -> None:
    read_fd, write_fd = os.pipe()
    job = RunJob(stage="full", problem_source="p\n", problem_name="p", candidate_source="c\n",
                 options=EvalOptions(trials=2), reported_device="cpu", job_dir="/j",
                 cache_dir="/c", build_dir="/b")
    write_frame(write_fd, job)
    write_frame(write_fd, RunnerReady(pid=1, device="cpu", device_name="x"))
    reader = FrameReader(read_fd)
    assert reader.read(RunJob, time.monotonic() + 5) == job
    assert reader.read(RunnerReady, time.monotonic() + 5).pid == 1
    assert reader.read(RunnerReady, time.monotonic() + 0.05) is None and not reader.eof
    os.close(write_fd)
    assert reader.read(RunnerReady, time.monotonic() + 5) is None and reader.eof
    os.close(read_fd)


def test_wrong_frame_type_is_refused() -> None:
    read_fd, write_fd = os.pipe()
    write_frame(write_fd, RunnerReady(pid=1, device="cpu", device_name="x"))
    with pytest.raises(FrameError, match="bad RunJob frame"):
        FrameReader(read_fd).read(RunJob, time.monotonic() + 5)
    os.close(read_fd)
    os.close(write_fd)
