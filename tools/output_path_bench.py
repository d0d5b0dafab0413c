"""Where a full comparison's time goes: the path of one candidate output from its runner to the
reference runner's comparison (eval/output_checks.py `Ship` and `Compare`), step by step, with the
evaluator's own pieces (`sealed_memfd`, `SharedBuffer`, `compare_tensor`), outside any runner.

Per output size, medians of `--repeats` rounds, in milliseconds:

* `memfd`: the judge creates the sealed buffer;
* `ship_map` / `ship_copy`: the candidate's runner maps it (pages populated) and copies its
  output into it; `fresh` into a new buffer (its pages allocated and zeroed by the mapping),
  `reused` into one already written once (what a judge's checked-call buffer is after the first);
* `ship_register` / `ship_copy_registered`: the same copy with the mapping page-locked first
  (cudaHostRegister), so the GPU writes it directly instead of through a staging buffer (GPU only);
* `compare_map` / `compare_load`: the reference's runner maps the buffer and moves it to the
  device (plain and page-locked);
* `compare_tensor`: the element-by-element check against a float64 accurate value
  (`--cpu-chunks A,B`: on the CPU, once per chunk size, side by side in this process).

    python tools/output_path_bench.py --device cuda:0 --sizes-mb 256,1024 --out results.json
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _ms(began: float) -> float:
    return (time.perf_counter() - began) * 1e3


class _Registered:
    """A mapping page-locked for the device while the block runs (cudaHostRegister)."""

    def __init__(self, mapping) -> None:
        import torch

        self.cudart = torch.cuda.cudart()
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        self.size = len(mapping)

    def __enter__(self) -> "_Registered":
        code = self.cudart.cudaHostRegister(self.address, self.size, 0)
        if int(code) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {code}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.cudart.cudaHostUnregister(self.address)


def one_round(device: str, nbytes: int, registered: bool) -> dict[str, float]:
    import torch

    from specgen.eval.compare import compare_tensor
    from specgen.eval.output_buffers import _zero, sealed_memfd
    from specgen.eval.runner import SharedBuffer
    from specgen.messages import OutputSlot

    numel = nbytes // 4
    generator = torch.Generator(device=device).manual_seed(numel)
    out = torch.randn(numel, device=device, generator=generator)
    ref = out + 1e-7 * torch.randn(numel, device=device, generator=generator)
    star = ref.to(torch.float64)
    slot = OutputSlot(offset=0, nbytes=nbytes, shape=[numel], dtype="float32")
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times: dict[str, float] = {}

    began = time.perf_counter()
    fd = sealed_memfd(nbytes)
    times["memfd"] = _ms(began)
    try:
        for label in ("fresh", "reused"):
            began = time.perf_counter()
            buffer = SharedBuffer(os.dup(fd))
            times[f"ship_map_{label}"] = _ms(began)
            began = time.perf_counter()
            buffer.view(slot).copy_(out)
            times[f"ship_copy_{label}"] = _ms(began)
            buffer.close()
        if registered:
            buffer = SharedBuffer(os.dup(fd))
            began = time.perf_counter()
            with _Registered(buffer.map):
                times["ship_register"] = _ms(began)
                began = time.perf_counter()
                buffer.view(slot).copy_(out)
                sync()
                times["ship_copy_registered"] = _ms(began)
                began = time.perf_counter()
            times["ship_unregister"] = _ms(began)
            buffer.close()

        began = time.perf_counter()
        buffer = SharedBuffer(os.dup(fd))
        times["compare_map"] = _ms(began)
        began = time.perf_counter()
        cand = buffer.view(slot).to(device)
        sync()
        times["compare_load"] = _ms(began)
        del cand
        if registered:
            began = time.perf_counter()
            with _Registered(buffer.map):
                cand = buffer.view(slot).to(device)
                sync()
            times["compare_load_registered"] = _ms(began)
        else:
            cand = buffer.view(slot).to(device)
        began = time.perf_counter()
        result = compare_tensor(cand, ref, star, "output", None, None)
        sync()
        times["compare_tensor"] = _ms(began)
        if not result.ok:
            raise RuntimeError(f"the bench's own outputs differ: {result.reason}")
        del cand
        buffer.close()
        began = time.perf_counter()
        _zero(fd, nbytes)
        times["zero"] = _ms(began)
    finally:
        os.close(fd)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes-mb", default="64,256")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-chunks", default="",
                        help="elements per float64 chunk of the CPU comparison, each in turn")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    from specgen.eval import compare

    registered = args.device.startswith("cuda")
    if registered:
        torch.cuda.set_device(torch.device(args.device))
    report: dict[str, object] = {
        "device": args.device,
        "device_name": torch.cuda.get_device_name(args.device) if registered else "cpu",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "sizes": {}}
    chunks = [int(c) for c in args.cpu_chunks.split(",") if c] or [compare._CPU_CHUNK]
    for size_mb in (int(s) for s in args.sizes_mb.split(",")):
        for chunk in chunks:
            compare._CPU_CHUNK = chunk
            rounds = [one_round(args.device, size_mb << 20, registered)
                      for _ in range(args.repeats)]
            medians = {key: round(statistics.median(r[key] for r in rounds), 2)
                       for key in rounds[0]}
            label = f"{size_mb} MiB" + (f", CPU chunk {chunk}" if len(chunks) > 1 else "")
            report["sizes"][label] = medians                  # type: ignore[index]
            print(f"{label}: " + ", ".join(f"{k} {v:g}" for k, v in medians.items()), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
