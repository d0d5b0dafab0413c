"""The judge's channel to a runner: strict typed messages over SOCK_SEQPACKET, several packets for
a long one, file descriptors with a message, kernel timestamps and the sender's pid."""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from specgen.eval.protocol import PACKET, Channel, ChannelClosed, FrameError, socket_pair
from specgen.messages import Compare, RunnerReady, Shipped, Trial, TrialDone


def pair() -> tuple[Channel, Channel]:
    judge, runner = socket_pair()
    return Channel(judge, "judge"), Channel(runner, "runner")


def test_requests_and_replies_round_trip_strictly_typed() -> None:
    judge, runner = pair()
    trial = Trial(index=3, seed=11, digest_seed=12, shape={"dim": 6})
    judge.send(trial)
    assert runner.recv(time.monotonic() + 5).message == trial
    runner.send(TrialDone(index=3, digests=[1.5]))
    got = judge.recv(time.monotonic() + 5)
    assert got.message == TrialDone(index=3, digests=[1.5]) and got.stamp_ns is not None
    assert judge.recv(time.monotonic() + 0.05) is None      # nothing more: a timeout, not an error


def test_a_reply_where_a_request_belongs_is_refused() -> None:
    judge, runner = pair()
    runner.send(RunnerReady(role="candidate", pid=1, device="cpu", device_name="x"))
    # A runner end decodes requests only: the same bytes sent to it fail loudly.
    raw_judge = Channel(judge.sock, "runner")
    with pytest.raises(FrameError, match="bad message"):
        raw_judge.recv(time.monotonic() + 5)


def test_long_messages_travel_as_several_packets() -> None:
    judge, runner = pair()
    big = Compare(trial=Trial(index=1, seed=1, digest_seed=2), slots=[])
    done = TrialDone(index=1, error="x" * (5 * PACKET + 7))
    # From a thread: more than the socket's buffer holds, as a runner's long error can be.
    sender = threading.Thread(target=runner.send, args=(done,))
    sender.start()
    assert judge.recv(time.monotonic() + 5).message == done
    sender.join()
    judge.send(big)
    assert runner.recv(time.monotonic() + 5).message == big


def test_a_deadline_between_the_packets_of_a_message_loses_none_of_it() -> None:
    # A judge polls a runner in short deadlines; a long reply (a built library) whose later packets
    # come after one of them must still arrive whole, not be read from its middle.
    import msgspec

    judge, runner = pair()
    done = TrialDone(index=1, error="y" * (2 * PACKET + 5))
    data = msgspec.msgpack.encode(done)
    first, rest = data[:PACKET], data[PACKET:]
    runner.sock.send(b"\x01" + first)                       # one packet, more to follow
    assert judge.recv(time.monotonic() + 0.05) is None       # the deadline falls mid-message
    runner.sock.send(b"\x01" + rest[:PACKET])
    runner.sock.send(b"\x00" + rest[PACKET:])
    assert judge.recv(time.monotonic() + 5).message == done
    runner.send(TrialDone(index=2))
    assert judge.recv(time.monotonic() + 5).message == TrialDone(index=2)


def test_file_descriptors_come_with_their_message() -> None:
    judge, runner = pair()
    read_fd, write_fd = os.pipe()
    judge.send(Trial(index=1, seed=1, digest_seed=1), fds=(write_fd,))
    got = runner.recv(time.monotonic() + 5)
    assert len(got.fds) == 1
    os.write(got.fds[0], b"through")
    assert os.read(read_fd, 7) == b"through"
    for fd in (*got.fds, read_fd, write_fd):
        os.close(fd)


def test_the_stamp_is_when_the_runner_sent_not_when_the_judge_read() -> None:
    judge, runner = pair()
    sent = time.clock_gettime_ns(time.CLOCK_REALTIME)
    runner.send(Shipped(index=1))
    time.sleep(0.2)                     # the judge is busy elsewhere before it reads
    got = judge.recv(time.monotonic() + 5)
    assert 0 <= got.stamp_ns - sent < 100_000_000


def test_the_kernel_names_the_sender() -> None:
    judge, runner = pair()
    judge.want_credentials(True)
    runner.send(Shipped(index=1))
    assert judge.recv(time.monotonic() + 5).sender_pid == os.getpid()


def test_garbage_and_a_closed_end_are_errors_not_hangs() -> None:
    judge_sock, runner_sock = socket_pair()
    judge = Channel(judge_sock, "judge")
    runner_sock.send(b"\x00not msgpack at all")
    with pytest.raises(FrameError):
        judge.recv(time.monotonic() + 5)
    runner_sock.send(b"\x07headerless")
    with pytest.raises(FrameError, match="header"):
        judge.recv(time.monotonic() + 5)
    runner_sock.close()
    with pytest.raises(ChannelClosed):
        judge.recv(time.monotonic() + 5)


def test_a_spinning_receiver_still_honours_its_deadline() -> None:
    judge, runner = pair()
    began = time.monotonic()
    assert runner.recv(time.monotonic() + 0.2, spin_s=0.05) is None
    assert 0.15 < time.monotonic() - began < 2.0
