"""`python -m specgen.cli ...`: the `specgen` command."""
import sys

from specgen.cli import main

if __name__ == "__main__":
    sys.exit(main())
