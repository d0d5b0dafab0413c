"""The virtual clock checked against the wall clock: the same generated problem-turns benched both
ways (`specgen bench --clock wall`, then `--clock virtual`, one after the other in this
invocation), and each job's end-to-end time set side by side (target: within 10% per job).

    python tools/clock_check.py --generate 2 --turns 1 --modes specgen,sequential --out DIR
    python tools/clock_check.py ... --devices cuda:0      # on a GPU machine

Everything after `--` goes to both bench runs as it is (e.g. `-- --eval-timeout 60`).
Writes DIR/wall/, DIR/virtual/ (each bench's own outputs) and DIR/clock_check.json, and prints a
table: mode, problem, wall s, virtual s, (virtual - wall) / wall.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def bench(clock: str, args: argparse.Namespace, extra: list[str]) -> dict:
    out = args.out / clock
    command = [sys.executable, "-m", "specgen.cli", "bench", "--clock", clock, "--generate",
               str(args.generate), "--turns", str(args.turns), "--concurrency", str(args.generate),
               "--seed", str(args.seed), "--modes", args.modes, "--speed", str(args.speed),
               "--fork-model", args.fork_model, "--out", str(out), *extra]
    if args.devices:
        command += ["--devices", args.devices]
    if args.problems:
        command += ["--problems", args.problems]
    done = subprocess.run(command, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"bench --clock {clock} exited {done.returncode}")
    return json.loads((out / "results.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--generate", type=int, default=2)
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default="specgen,sequential")
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--fork-model", default="draft", choices=("draft", "named"))
    parser.add_argument("--devices", default="")
    parser.add_argument("--problems", default="")
    parser.add_argument("--out", type=Path, default=Path("out/clock_check"))
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    wall = bench("wall", args, extra)
    virtual = bench("virtual", args, extra)
    measured = {(j["mode"], j["problem"]): j["end_to_end_s"] for j in wall["jobs"]}
    rows = []
    for job in virtual["jobs"]:
        w = measured.get((job["mode"], job["problem"]))
        v = job["end_to_end_s"]
        rows.append({"mode": job["mode"], "problem": job["problem"], "wall_s": w, "virtual_s": v,
                     "off": (v - w) / w if w else None})
    print("| mode | problem | wall s | virtual s | off |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        off = "-" if r["off"] is None else f"{r['off']:+.1%}"
        wall_s = "-" if r["wall_s"] is None else f"{r['wall_s']:.1f}"
        print(f"| {r['mode']} | {r['problem']} | {wall_s} | {r['virtual_s']:.1f} | {off} |")
    within = [abs(r["off"]) <= 0.10 for r in rows if r["off"] is not None]
    print(f"\n{sum(within)} of {len(within)} jobs within 10% (speed {args.speed:g}, fork model "
          f"{args.fork_model}, {wall['hardware']})")
    (args.out / "clock_check.json").write_text(json.dumps({"rows": rows, "hardware": wall["hardware"],
                                                            "speed": args.speed}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
