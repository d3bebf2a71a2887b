"""Function calling on the Berkeley Function-Calling Leaderboard (BFCL v4): its public single-turn AST
categories against any OpenAI-compatible server, tool_choice "auto" and "required", per category accuracy
and wall time, optionally side by side with a second server.

Data and checker come from the `bfcl-eval` wheel (Apache-2.0), a bench dependency, not a runtime one:

    python -m pip download --no-deps bfcl-eval==2026.3.23 -d /tmp/bfcl
    python -m pip install --no-deps /tmp/bfcl/bfcl_eval-2026.3.23-py3-none-any.whl

Only its data files and its AST checker are used; the checker's import of the model registry (which
pulls every vendor SDK) is replaced by a stub that says function names had their dots replaced by
underscores, as OpenAI-style tool names must (BFCL does the same for every OpenAI-compatible model).

Categories (`--categories`): simple (BFCL_v4_simple_python), multiple, parallel, parallel_multiple,
live_simple and irrelevance; `--n` cases of each (25), evenly spaced over the file (case i * len // n).
Each case is one chat request, as BFCL's function-calling handlers send it: the question's messages, the
functions as OpenAI tools (names with `.` -> `_`, BFCL types mapped to JSON-schema types, the
description followed by BFCL's " Note that the provided function is in Python 3 syntax."), temperature
0, `--max-tokens` (512), the mode's `tool_choice`. The reply's `tool_calls` become BFCL's decoded form
`[{name: arguments}]` (a call whose arguments are not a JSON object makes the case wrong) and BFCL's
`ast_checker` judges them; irrelevance is right when the reply has no tool call (it is not run under
"required", which forces one). Requests go one at a time; a category's wall time is the sum of its
requests' times. An HTTP error is a wrong case, counted and printed.

    python bench/function_calling.py --base-url http://127.0.0.1:8123/v1 [--peer-url URL] [--modes auto,required]
        [--n 25] [--categories simple,multiple,...] [--max-tokens 512] [--model ID] [--peer-model ID] [--json PATH]

Prints one table per mode (per category: correct / n, accuracy, wall time; the peer's beside it) and,
with `--json`, every case's reply and verdict. Not run in CI (a few seconds per case on a CPU).
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import sys
import time
import types
from dataclasses import asdict, dataclass, field

import httpx

CATEGORIES = {  # name -> BFCL v4 file (data/BFCL_v4_<file>.json, answers under data/possible_answer/)
    "simple": "simple_python",
    "multiple": "multiple",
    "parallel": "parallel",
    "parallel_multiple": "parallel_multiple",
    "live_simple": "live_simple",
    "irrelevance": "irrelevance",
}
MODES = ("auto", "required")
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
CHECKER_MODEL = "jaxchat_bench"  # the checker looks it up as "jaxchat/bench"


@dataclass
class CaseResult:
    id: str
    correct: bool
    seconds: float
    calls: list = field(default_factory=list)  # [(name, arguments text)]
    content: str | None = None
    finish_reason: str | None = None
    error: str = ""


# ---- BFCL data and checker ------------------------------------------------------------------------
def _data_file(*parts: str):
    return importlib.resources.files("bfcl_eval").joinpath("data", *parts)


def load_cases(category: str, n: int) -> list[tuple[dict, dict | None]]:
    """`n` evenly spaced (case, answer) pairs of a category (answer None for irrelevance)."""
    name = f"BFCL_v4_{CATEGORIES[category]}.json"
    cases = [json.loads(line) for line in _data_file(name).read_text().splitlines() if line.strip()]
    answers = {}
    if category != "irrelevance":
        for line in _data_file("possible_answer", name).read_text().splitlines():
            if line.strip():
                answer = json.loads(line)
                answers[answer["id"]] = answer
    picked = [cases[i * len(cases) // n] for i in range(min(n, len(cases)))]
    return [(case, answers.get(case["id"])) for case in picked]


def load_checker():
    """BFCL's `ast_checker` and `Language`, with the model registry stubbed (see the module docstring)."""
    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = {CHECKER_MODEL.replace("_", "/"): types.SimpleNamespace(underscore_to_dot=True)}
    sys.modules["bfcl_eval.constants.model_config"] = stub
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    return ast_checker, Language


def _type_map() -> dict[str, str]:
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    return GORILLA_TO_OPENAPI


def _schema(value: dict, types_: dict[str, str]) -> dict:
    """A BFCL parameter schema with JSON-schema types (unknown or missing types are strings)."""
    out = dict(value)
    out["type"] = types_.get(value.get("type", "string"), "string")
    if isinstance(value.get("properties"), dict):
        out["properties"] = {k: _schema(v, types_) for k, v in value["properties"].items()}
    if isinstance(value.get("items"), dict):
        out["items"] = _schema(value["items"], types_)
    return out


def openai_tools(functions: list[dict]) -> list[dict]:
    types_ = _type_map()
    tools = []
    for f in functions:
        params = _schema(f.get("parameters") or {"type": "dict", "properties": {}}, types_)
        params["type"] = "object"
        tools.append({"type": "function", "function": {
            "name": f["name"].replace(".", "_"), "description": f.get("description", "") + PYTHON_HINT,
            "parameters": params}})
    return tools


def decoded_calls(calls: list[tuple[str, str]]) -> list[dict] | None:
    """BFCL's decoded form of the reply's calls, or None when some call's arguments are not a JSON object."""
    out = []
    for name, arguments in calls:
        try:
            value = json.loads(arguments)
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        out.append({name: value})
    return out


def verdict(checker, category: str, case: dict, answer: dict | None, calls: list[tuple[str, str]]) -> tuple[bool, str]:
    ast_checker, language = checker
    decoded = decoded_calls(calls)
    if category == "irrelevance":
        return (not calls, "" if not calls else "called a tool")
    if decoded is None:
        return False, "arguments are not a JSON object"
    if not decoded:
        return False, "no tool call"
    try:
        result = ast_checker(case["function"], decoded, answer["ground_truth"], language.PYTHON,
                             CATEGORIES[category], CHECKER_MODEL)
    except Exception as exc:  # noqa: BLE001 - the checker raises on some malformed outputs: the case is wrong
        return False, f"checker: {type(exc).__name__}: {exc}"
    return bool(result["valid"]), "" if result["valid"] else json.dumps(result.get("error"), default=str)[:300]


# ---- the server ------------------------------------------------------------------------------------
def model_id(client: httpx.Client, base_url: str) -> str:
    r = client.get(f"{base_url}/models")
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def run_case(client: httpx.Client, base_url: str, model: str, mode: str, max_tokens: int, checker, category: str,
             case: dict, answer: dict | None) -> CaseResult:
    body = {"model": model, "messages": case["question"][0], "tools": openai_tools(case["function"]),
            "tool_choice": mode, "temperature": 0, "max_tokens": max_tokens}
    t0 = time.perf_counter()
    try:
        r = client.post(f"{base_url}/chat/completions", json=body)
    except httpx.HTTPError as exc:
        return CaseResult(case["id"], False, time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - t0
    if r.status_code != 200:
        return CaseResult(case["id"], False, seconds, error=f"HTTP {r.status_code}: {r.text[:300]}")
    choice = r.json()["choices"][0]
    message = choice["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or ()]
    ok, why = verdict(checker, category, case, answer, calls)
    return CaseResult(case["id"], ok, seconds, calls, message.get("content"), choice.get("finish_reason"), why)


def run_server(base_url: str, model: str | None, modes, categories, n: int, max_tokens: int, checker,
               timeout: float) -> dict:
    """{mode: {category: [CaseResult]}} for one server."""
    out: dict = {}
    with httpx.Client(timeout=timeout) as client:
        model = model or model_id(client, base_url)
        for mode in modes:
            out[mode] = {}
            for category in categories:
                if mode == "required" and category == "irrelevance":
                    continue  # a forced call is never right there
                results = []
                for case, answer in load_cases(category, n):
                    result = run_case(client, base_url, model, mode, max_tokens, checker, category, case, answer)
                    results.append(result)
                    mark = "ok " if result.correct else "BAD"
                    print(f"  [{base_url} {mode} {category}] {mark} {result.id} {result.seconds:.1f}s "
                          f"{result.finish_reason} {result.error[:120]}", file=sys.stderr, flush=True)
                out[mode][category] = results
    return {"model": model, "results": out}


def _cell(results: list[CaseResult] | None) -> str:
    if not results:
        return f"{'n/a':>22}"
    correct = sum(r.correct for r in results)
    wall = sum(r.seconds for r in results)
    return f"{correct:>3}/{len(results):<3} {100 * correct / len(results):5.1f}% {wall:7.1f}s"


def print_tables(runs: dict[str, dict], modes, categories) -> None:
    names = list(runs)
    for mode in modes:
        print(f"\ntool_choice {mode!r}")
        print(f"{'category':<18}" + "".join(f"{name[:22]:>24}" for name in names))
        for category in categories:
            print(f"{category:<18}" + "".join(f"  {_cell(runs[n]['results'].get(mode, {}).get(category))}" for n in names))
        for name in names:
            every = [r for rs in runs[name]["results"].get(mode, {}).values() for r in rs]
            not_json = sum(r.error == "arguments are not a JSON object" for r in every)
            errors = sum(r.error.startswith(("HTTP", "Connect", "Read", "Remote")) for r in every)
            correct = sum(r.correct for r in every)
            print(f"  {name}: {correct}/{len(every)} overall, {not_json} with arguments that are not a JSON object, "
                  f"{errors} request errors")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8123/v1")
    ap.add_argument("--peer-url", help="a second server, run on the same cases after the first")
    ap.add_argument("--model", help="model id (default: the first of GET /models)")
    ap.add_argument("--peer-model", help="the peer's model id (default: the first of its GET /models)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--n", type=int, default=25, help="cases per category, evenly spaced")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per request")
    ap.add_argument("--json", help="write every case's reply and verdict here")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    categories = [c for c in args.categories.split(",") if c]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}; known: {', '.join(MODES)}")
    for c in categories:
        if c not in CATEGORIES:
            ap.error(f"unknown category {c!r}; known: {', '.join(CATEGORIES)}")
    try:
        checker = load_checker()
    except ImportError as exc:
        print(f"bfcl-eval is not installed ({exc}); see the module docstring", file=sys.stderr)
        return 2
    servers = [(args.base_url.rstrip("/"), args.model)]
    if args.peer_url:
        servers.append((args.peer_url.rstrip("/"), args.peer_model))
    runs = {}
    for url, model in servers:
        t0 = time.perf_counter()
        runs[url] = run_server(url, model, modes, categories, args.n, args.max_tokens, checker, args.timeout)
        runs[url]["wall_s"] = time.perf_counter() - t0
    print(f"\nBFCL v4, {args.n} cases per category, temperature 0, max_tokens {args.max_tokens}")
    for url, run in runs.items():
        print(f"  {url}: model {run['model']}, {run['wall_s']:.0f} s")
    print_tables(runs, modes, categories)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "runs": {url: {**run, "results": {
                mode: {cat: [asdict(r) for r in rs] for cat, rs in per.items()} for mode, per in run["results"].items()}}
                for url, run in runs.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
