"""How often the model's own greedy choice is already what the grammar allows, per family of the serve mix
(issue 51; a question, no bar).

A lever for the mix's mask fill would be to sample without the mask first and fill it only when the matcher
refuses the token (exact for greedy rows). It pays only as often as the unconstrained argmax is allowed. This
sends each family of `bench/serve.py --constraint mix` once, greedy, with `logprobs` and `top_logprobs: 1` (our
logprobs are the model's raw distribution, before penalties and mask), to a running `jaxchat serve`, and counts
the output tokens whose top-1 raw token is the token the constrained request chose. Tokens appended by
jump-forward are counted too (they need no mask either way).

    .venv/bin/jaxchat serve --port 8311 &
    .venv/bin/python bench/mask_agreement.py --url http://127.0.0.1:8311
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serve  # noqa: E402


def completion(url: str, body: dict) -> dict:
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8311")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    for family, fields in zip(serve.MIX_FAMILIES, serve.MIX, strict=True):
        body = {"messages": serve.MESSAGES, "max_tokens": args.max_tokens, "temperature": 0, "logprobs": True,
                "top_logprobs": 1, **fields}
        content = (completion(args.url, body)["choices"][0].get("logprobs") or {}).get("content") or []
        agree = sum(1 for e in content if e["top_logprobs"] and e["top_logprobs"][0]["token"] == e["token"])
        share = agree / len(content) if content else 0.0
        print(f"{family:7s} {len(content):3d} tokens, the raw top-1 chosen at {agree:3d} ({share:.0%})")


if __name__ == "__main__":
    main()
