"""Judge candidate files on one worker and print each verdict in a line, optionally with another
tree of the code (an earlier commit unpacked in a folder) so that one attack can be seen against
both designs, side by side in one invocation.

    python tools/judge_files.py tests/eval/redteam/claims_huge_outputs.py
    python tools/judge_files.py --tree /tmp/base --stage full FILE...

Each FILE's `# problem:` header names its problem (tests/eval/conftest.py finds it). With --tree,
the worker is that tree's (its compiled modules must be there: copy specgen/eval/_digest*.so);
the candidate files are read from this tree either way. An exception out of the worker is printed
as what it is, and the next file is judged by a fresh worker.
"""
from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--tree", type=Path, default=None, help="judge with this tree of the code")
    parser.add_argument("--stage", default="full", choices=("validate", "profile", "full"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/specgen-judge-files"))
    args = parser.parse_args()
    tree = (args.tree or REPO).resolve()
    sys.path.insert(0, str(REPO))                   # tests.eval.conftest: the problem of a file
    from tests.eval.conftest import candidate_submission

    submissions = [(path, candidate_submission(path.resolve())) for path in args.files]
    sys.path.insert(0, str(tree))                   # the worker: this tree's or --tree's
    for name in [m for m in sys.modules if m == "specgen" or m.startswith("specgen.")]:
        del sys.modules[name]
    import specgen
    from specgen.eval import EvalWorker
    from specgen.messages import EvalOptions

    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"tree {Path(specgen.__file__).parent.parent} ({commit or 'no git'}), device "
          f"{args.device}, stage {args.stage}, {datetime.datetime.now().isoformat(timespec='seconds')}")
    worker = None
    for path, submission in submissions:
        if worker is None:
            worker = EvalWorker(args.device, args.work_dir, options=EvalOptions())
            worker.start()
        began = time.monotonic()
        try:
            v = worker.run(submission, args.stage)
        except Exception as exc:  # noqa: BLE001 - what an earlier tree let out of its worker
            print(f"{path.stem}: the worker raised {type(exc).__name__}: {str(exc)[:120]}")
            worker.close()
            worker = None
            continue
        speedup = f"{v.speedup:.2f}x" if v.speedup else "-"
        print(f"{path.stem}: correct={v.correct} speedup={speedup} code={v.code or '-'} "
              f"flags={[f.split(':')[0] for f in v.flags]} error={(v.error or '')[:110]!r} "
              f"({time.monotonic() - began:.1f} s)")
    if worker is not None:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
