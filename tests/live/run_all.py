"""Run every live check against an OpenAI-compatible server; exit non-zero on any failure.

Usage:
    python tests/live/run_all.py --base-url http://127.0.0.1:8000 --model MODEL [--api-key KEY]
        [--max-tokens 256] [--timeout 600] [--only tools.] [--concurrency 2]
Standard library only (urllib, json, argparse). Prints one PASS/FAIL line per check and a summary.
`ALL_CHECKS` is the list the pytest wrapper (`tests/server/test_live_scripts.py`) runs against the
fake-service server.
"""

from __future__ import annotations

import sys

try:
    from . import check_contract, check_tools, livelib
except ImportError:  # run as a script
    import check_contract
    import check_tools
    import livelib

ALL_CHECKS = check_contract.CHECKS + check_tools.CHECKS


def main(argv: list[str] | None = None) -> int:
    return livelib.main_for(ALL_CHECKS, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
