"""A worker's output buffers (specgen/eval/output_buffers.py): kept for the next verdict of the
same job, zeroed before another's, bounded, sealed."""
from __future__ import annotations

import mmap
import os

import pytest

from specgen.eval.output_buffers import MIN_BYTES, OutputBuffers, sealed_memfd


def _write(fd: int, data: bytes) -> None:
    with mmap.mmap(fd, os.fstat(fd).st_size) as mapping:
        mapping[:len(data)] = data


def _read(fd: int, size: int) -> bytes:
    with mmap.mmap(fd, os.fstat(fd).st_size) as mapping:
        return bytes(mapping[:size])


def test_a_buffer_goes_back_to_the_same_jobs_next_verdict_as_it_was():
    pool = OutputBuffers(keep_bytes=64 << 20)
    first = pool.take(3 << 20, "job-a")
    fd = first.fd
    _write(fd, b"output of job a")
    pool.give(first, "job-a")
    again = pool.take(2 << 20, "job-a")
    assert again.fd == fd and _read(fd, 15) == b"output of job a"
    assert (pool.created, pool.reused, pool.zeroed) == (1, 1, 0)
    pool.close()


@pytest.mark.parametrize("next_owner", ["job-b", ""])
def test_another_job_gets_a_kept_buffer_only_zeroed(next_owner: str):
    pool = OutputBuffers(keep_bytes=64 << 20)
    first = pool.take(MIN_BYTES, "job-a")
    _write(first.fd, b"\xff" * MIN_BYTES)
    pool.give(first, "job-a")
    taken = pool.take(MIN_BYTES, next_owner)
    assert taken.fd == first.fd and pool.zeroed == 1
    assert _read(taken.fd, MIN_BYTES) == bytes(MIN_BYTES)
    pool.close()


def test_a_one_off_requests_buffer_is_zeroed_even_for_another_one_off():
    pool = OutputBuffers(keep_bytes=64 << 20)
    first = pool.take(MIN_BYTES, "")
    _write(first.fd, b"secret")
    pool.give(first, "")
    assert _read(pool.take(MIN_BYTES, "").fd, 6) == bytes(6)
    pool.close()


def test_the_smallest_kept_buffer_that_fits_is_taken_and_a_small_one_never_grows():
    pool = OutputBuffers(keep_bytes=64 << 20)
    small, large = pool.take(MIN_BYTES, "j"), pool.take(8 << 20, "j")
    pool.give(large, "j")
    pool.give(small, "j")
    assert pool.take(100, "j").fd == small.fd
    assert pool.take(4 << 20, "j").fd == large.fd
    bigger = pool.take(16 << 20, "j")
    assert bigger.size == 16 << 20 and pool.created == 3
    pool.close()


def test_no_more_than_keep_bytes_are_kept_the_oldest_going_first():
    pool = OutputBuffers(keep_bytes=5 << 20)
    a, b, c = (pool.take(2 << 20, "j") for _ in range(3))
    for buffer in (a, b, c):
        pool.give(buffer, "j")
    assert pool.kept_bytes == 4 << 20 and a.fd == -1 and b.fd >= 0 and c.fd >= 0
    pool.close()
    assert b.fd == -1 and c.fd == -1 and pool.kept_bytes == 0


def test_nothing_is_kept_without_room_or_after_close():
    pool = OutputBuffers(keep_bytes=0)
    buffer = pool.take(10, "j")
    pool.give(buffer, "j")
    assert buffer.fd == -1 and pool.kept_bytes == 0
    pool = OutputBuffers(keep_bytes=64 << 20)
    buffer = pool.take(10, "j")
    pool.close()
    pool.give(buffer, "j")
    assert buffer.fd == -1


def test_a_buffer_is_sealed_against_resizing():
    fd = sealed_memfd(MIN_BYTES)
    try:
        for size in (MIN_BYTES // 2, MIN_BYTES * 2):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, size)
    finally:
        os.close(fd)
