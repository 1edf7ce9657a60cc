"""``harmonaize-sim`` (being built)."""

import sys


def main() -> int:
    print("harmonaize-sim: not built yet", file=sys.stderr)
    return 2
