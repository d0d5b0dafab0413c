"""The template: one process per evaluation worker that has imported torch and Triton (and no CUDA
context) and forks every runner of that worker.

`python -m specgen.eval.template --control-fd N [--sandboxed] [--mapped] [--keep JSON]`

A fresh interpreter pays seconds for `import torch` and more for a CUDA context; a child forked
from a process that imported them pays neither import, and creates its own CUDA context (a few
tenths of a second), since no context exists before the fork to be inherited broken. The
template reads `ForkRunner` requests from its control channel, each with the runner's end of a
new channel attached, and for each:

1. forks (the child's output goes to the runner's own log, whose fd also came with the request);
   the child (still holding the namespace's capabilities, when sandboxed) makes its own
   namespaces and private /tmp (eval/namespaces.py: `isolate`), forks again and exits;
2. that grandchild is PID 1 of the new PID namespace: it mounts that namespace's /proc, says
   `RunnerStarted` on the runner's channel (the kernel tells the judge its pid in the host's
   namespace) and waits for `Proceed`, which the judge sends once it has put it in the runner's
   control group (eval/containment.py);
3. it forks the runner (PID 2), drops its own privileges and waits as the namespace's init (when
   the runner ends, it says how on the channel, `RunnerExited`, and exits with that status); the
   runner drops every privilege (an unprivileged uid per role, no capability, no_new_privs,
   RLIMIT_NPROC), closes every descriptor but its channel, and serves (eval/runner.py).

The template never runs candidate or problem code and never reads anything but its control
channel. When the control channel closes (its worker died or closed it), the template exits; in
a sandbox its PID namespace's init then ends, and with it every runner it forked.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time


def _warm_imports() -> str:
    """Everything a runner imports, imported once here (the fork inherits it)."""
    import torch
    import torch.nn.functional  # noqa: F401

    # torch.utils.cpp_extension asks torch.cuda.is_available() at import, only to log a warning;
    # asking starts the CUDA driver, and torch then refuses CUDA in every fork of this process.
    is_available = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        torch.cuda.is_available = is_available

    triton_version = ""
    try:
        import triton
        import triton.language  # noqa: F401
        triton_version = triton.__version__
    except ImportError:
        pass
    try:
        import numpy  # noqa: F401
    except ImportError:
        pass
    from specgen.eval import calls, compare, digest, extensions, params, runner  # noqa: F401
    from specgen.eval.guards import dynamic  # noqa: F401
    digest.extension()       # loads the compiled digest; its CUDA runtime starts in the runner
    return triton_version


def _check_forks_can_start_cuda() -> None:
    """Fail now, saying why, if something the template imported started CUDA: its forks could not
    (torch marks a fork of a process that did as unable to)."""
    import torch

    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("CUDA was started in the template before any runner was forked (an "
                           "import asked the CUDA runtime for its devices): runners could not use "
                           "the GPU")


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    parser = argparse.ArgumentParser(prog="specgen.eval.template")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sandboxed", action="store_true")
    parser.add_argument("--mapped", action="store_true", help="runner uids are mapped")
    parser.add_argument("--keep", default="[]", help="JSON list of read-only paths under /tmp")
    args = parser.parse_args(argv)
    control_sock = socket.socket(fileno=args.control_fd)

    from specgen.eval.protocol import Channel, ChannelClosed
    from specgen.messages import ForkRunner, RunnerReady

    control = Channel(control_sock, "runner")
    triton_version = _warm_imports()
    import torch
    if args.device.startswith("cuda"):
        _check_forks_can_start_cuda()
    control.send(RunnerReady(role="template", pid=os.getpid(), device=args.device,
                             device_name="", torch_version=str(torch.__version__),
                             triton_version=triton_version,
                             startup_s=time.monotonic() - started))
    keep = json.loads(args.keep)
    while True:
        try:
            received = control.recv()
        except ChannelClosed:
            break
        if received is None:
            break
        request, fds = received.message, received.fds
        if not isinstance(request, ForkRunner) or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        forked = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.dup2(fds[1], 1)
            os.dup2(fds[1], 2)
            os.close(fds[1])
            _first_child(request, fds[0], args, keep, control_sock.fileno(), forked)
        for fd in fds:
            os.close(fd)
        try:
            os.waitpid(pid, 0)        # it exits as soon as the runner's init is forked
        except ChildProcessError:
            pass
    return 0


def _first_child(request: "ForkRunner", runner_fd: int, args: argparse.Namespace,
                 keep: list[str], control_fd: int, forked: float) -> None:
    """Steps 1-3 of the module doc; never returns."""
    try:
        os.close(control_fd)
        from specgen.eval import namespaces, sandbox

        uid = sandbox.runner_uid(request.role) if args.mapped else None
        scratch_uid = uid if args.mapped else None
        if args.sandboxed:
            namespaces.isolate(request.scratch_mb, keep, scratch_uid)
        init = os.fork()
        if init:
            os._exit(0)
        _init(request, runner_fd, args, uid, forked)
    except BaseException as exc:  # noqa: BLE001 - report and die; the judge sees the hang-up
        _say(f"specgen template: starting a {request.role} runner failed: {exc}\n")
        os._exit(126)


def _init(request: "ForkRunner", runner_fd: int, args: argparse.Namespace, uid: int | None,
          forked: float) -> None:
    from specgen.eval import namespaces
    from specgen.eval.protocol import Channel
    from specgen.messages import Proceed, RunnerExited, RunnerStarted

    if args.sandboxed:
        namespaces.mount_proc()
        namespaces.set_hostname("specgen-runner")
    else:
        os.setsid()           # without a PID namespace, the judge kills the runner's group
    channel = Channel(socket.socket(fileno=runner_fd), "runner")
    channel.send(RunnerStarted())
    received = channel.recv(time.monotonic() + 60.0)
    if received is None or not isinstance(received.message, Proceed):
        os._exit(125)
    runner = os.fork()
    if runner == 0:
        _runner(request, channel, args, uid, forked)
    if args.sandboxed:
        namespaces.drop_privileges(uid, None)
    status = namespaces.reap_until(runner)
    # The runner is gone (nothing else writes on the channel now): say how, then end the
    # namespace with that status.
    try:
        channel.send(RunnerExited(status=status))
    except OSError:
        pass
    os._exit(status)


def _runner(request: "ForkRunner", channel: "Channel", args: argparse.Namespace,
            uid: int | None, forked: float) -> None:
    from specgen.eval import namespaces, runner

    try:
        own = channel.fileno()
        os.closerange(3, own)
        os.closerange(own + 1, 1 << 16)
        if request.role == "build":
            # A build sees no GPU: no CUDA context, and the compiler's target comes from
            # TORCH_CUDA_ARCH_LIST, which the worker set.
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        if args.sandboxed:
            namespaces.drop_privileges(uid, request.max_processes,
                                       dumpable=request.role != "reference")
        elif request.role == "reference":
            namespaces.make_undumpable()     # no process of this uid may trace it or read it
        os.chdir(os.environ.get("HOME", "/tmp"))
        device = args.device if request.role != "build" else "cpu"
        runner.serve(request.role, channel, device, forked, request.address_space_mb,
                     request.gpu_memory_fraction)
    except BaseException as exc:  # noqa: BLE001
        _say(f"specgen runner: {type(exc).__name__}: {exc}\n")
        os._exit(1)
    os._exit(0)


def _say(text: str) -> None:
    """Write to stderr, whatever state it is in: the runner's log may be full (it is capped) or
    the candidate may have closed or replaced the stream, and an exception here would carry the
    runner out of `_runner` into its init's code instead of to its exit."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001
        pass


if __name__ == "__main__":
    sys.exit(main())
