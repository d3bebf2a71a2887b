"""Run `jaxchat.server.serve` with the fake service (used by the SIGTERM test and for manual tries).

python -m tests.server.serve_fake --port 8011 [--api-key KEY] [--grace 2] [--slow-delay 0.02]
"""

from __future__ import annotations

import argparse
import logging

from jaxchat.api import Limits
from jaxchat.server import serve
from tests.server.fake import FakeService


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--api-key")
    ap.add_argument("--grace", type=float, default=10.0)
    ap.add_argument("--slow-delay", type=float, default=0.02)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    serve(
        FakeService(slow_delay=args.slow_delay),
        port=args.port,
        api_key=args.api_key,
        limits=Limits(shutdown_grace_s=args.grace),
        log_level="warning",
    )
    print("serve returned", flush=True)


if __name__ == "__main__":
    main()
