"""The judge's channel to a runner: strict typed messages over SOCK_SEQPACKET, several packets for
a long one, file descriptors with a message, kernel timestamps and the sender's pid."""
from __future__ import annotations

import array
import os
import socket
import threading
import time

import pytest

from specgen.eval.protocol import PACKET, Channel, ChannelClosed, FrameError, socket_pair
from specgen.messages import LoadProblem, ParamsSet, ProblemLoaded, RunnerReady, SetParams


def pair() -> tuple[Channel, Channel]:
    judge, runner = socket_pair()
    return Channel(judge, "judge"), Channel(runner, "runner")


def test_requests_and_replies_round_trip_strictly_typed() -> None:
    judge, runner = pair()
    request = LoadProblem(problem_source="x = 1\n", problem_name="p", scale="small", init_seed=11)
    judge.send(request)
    assert runner.recv(time.monotonic() + 5).message == request
    runner.send(ProblemLoaded(flops=3, shape_constants={"dim": 6}))
    got = judge.recv(time.monotonic() + 5)
    assert got.message == ProblemLoaded(flops=3, shape_constants={"dim": 6}) and got.stamp_ns is not None
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
    big = LoadProblem(problem_source="y" * (3 * PACKET), problem_name="p", scale="small", init_seed=1)
    done = ProblemLoaded(error="x" * (5 * PACKET + 7))
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
    done = ProblemLoaded(error="y" * (2 * PACKET + 5))
    data = msgspec.msgpack.encode(done)
    first, rest = data[:PACKET], data[PACKET:]
    runner.sock.send(b"\x01" + first)                       # one packet, more to follow
    assert judge.recv(time.monotonic() + 0.05) is None       # the deadline falls mid-message
    runner.sock.send(b"\x01" + rest[:PACKET])
    runner.sock.send(b"\x00" + rest[PACKET:])
    assert judge.recv(time.monotonic() + 5).message == done
    runner.send(ParamsSet())
    assert judge.recv(time.monotonic() + 5).message == ParamsSet()


def test_file_descriptors_come_with_their_message() -> None:
    judge, runner = pair()
    read_fd, write_fd = os.pipe()
    judge.send(SetParams(seed=1), fds=(write_fd,))
    got = runner.recv(time.monotonic() + 5)
    assert len(got.fds) == 1
    os.write(got.fds[0], b"through")
    assert os.read(read_fd, 7) == b"through"
    for fd in (*got.fds, read_fd, write_fd):
        os.close(fd)


def test_the_stamp_is_when_the_runner_sent_not_when_the_judge_read() -> None:
    judge, runner = pair()
    sent = time.clock_gettime_ns(time.CLOCK_REALTIME)
    runner.send(ParamsSet())
    time.sleep(0.2)                     # the judge is busy elsewhere before it reads
    got = judge.recv(time.monotonic() + 5)
    assert 0 <= got.stamp_ns - sent < 100_000_000


def test_the_kernel_names_the_sender() -> None:
    judge, runner = pair()
    judge.want_credentials(True)
    runner.send(ParamsSet())
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


# ---------------------------------------------------------------------- descriptors a peer pushes

def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def send_raw(sock: socket.socket, payload: bytes, fds: list[int]) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([payload], ancillary)


def test_descriptors_nobody_asked_for_are_closed_at_once() -> None:
    # A runner owns its process: it can attach descriptors to every reply. Unasked for, each is
    # closed as it arrives (one validation left a worker holding 5,210).
    judge, runner = pair()
    read_fd, write_fd = os.pipe()
    before = open_fds()
    for index in range(50):
        runner.send(ParamsSet(error=str(index)), fds=(write_fd, write_fd, read_fd, write_fd))
        assert judge.recv(time.monotonic() + 5, max_fds=0).fds == []
    assert open_fds() == before
    runner.send(ParamsSet(), fds=(write_fd, read_fd, write_fd, read_fd))
    got = judge.recv(time.monotonic() + 5, max_fds=2)
    assert len(got.fds) == 2 and open_fds() == before + 2     # the first two, kept for the caller
    os.write(got.fds[0], b"kept")
    assert os.read(read_fd, 4) == b"kept"
    for fd in (*got.fds, read_fd, write_fd):
        os.close(fd)


def test_a_message_of_several_packets_leaks_no_descriptors() -> None:
    import msgspec

    judge, runner = pair()
    read_fd, write_fd = os.pipe()
    data = msgspec.msgpack.encode(ProblemLoaded(error="z" * (3 * PACKET), flops=7))
    chunks = [data[i:i + PACKET] for i in range(0, len(data), PACKET)]
    before = open_fds()
    # Every packet carries four: asked for one, the judge keeps one, across a deadline that falls
    # between two packets too.
    send_raw(runner.sock, b"\x01" + chunks[0], [write_fd] * 4)
    assert judge.recv(time.monotonic() + 0.05, max_fds=1) is None
    assert open_fds() == before + 1
    for chunk in chunks[1:-1]:
        send_raw(runner.sock, b"\x01" + chunk, [write_fd] * 4)
    send_raw(runner.sock, b"\x00" + chunks[-1], [write_fd] * 4)
    got = judge.recv(time.monotonic() + 5, max_fds=1)
    assert got.message.flops == 7 and len(got.fds) == 1 and open_fds() == before + 1
    os.close(got.fds[0])
    # A message cut off by the end's closing: what its packets brought goes with it.
    send_raw(runner.sock, b"\x01" + chunks[0], [write_fd] * 4)
    assert judge.recv(time.monotonic() + 0.05) is None
    assert open_fds() == before + 4
    runner.sock.close()
    with pytest.raises(ChannelClosed):
        judge.recv(time.monotonic() + 5)
    assert open_fds() == before - 1          # the runner's end, closed just now
    judge.close()
    for fd in (read_fd, write_fd):
        os.close(fd)


def test_a_packet_with_more_descriptors_than_allowed_is_refused_and_none_stays() -> None:
    judge, runner = pair()
    read_fd, write_fd = os.pipe()
    before = open_fds()
    for credentials in (False, True):     # with or without room for the sender's credentials
        judge.want_credentials(credentials)
        send_raw(runner.sock, b"\x00" + b"\x90", [write_fd] * 12)
        with pytest.raises(FrameError, match="more file descriptors"):
            judge.recv(time.monotonic() + 5)
        assert open_fds() == before
    # An empty packet reads as the end of the channel: what it carried is closed all the same.
    send_raw(runner.sock, b"", [write_fd] * 3)
    with pytest.raises(ChannelClosed):
        judge.recv(time.monotonic() + 5)
    assert open_fds() == before
    for fd in (read_fd, write_fd):
        os.close(fd)
