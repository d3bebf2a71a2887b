"""5. Security, on live servers with the REAL pipeline.

- With an API key every route but /health needs `Authorization: Bearer <key>`, streaming included.
- The chat template renders in a sandbox: Jinja syntax in a message or a tool description reaches the
  model as text (checked on the prompt token ids the engine receives); a template that reaches for
  Python internals fails cleanly (a 4xx/5xx body without internals, nothing executed).
- `jaxchat serve` binds 127.0.0.1 unless told otherwise.
- Error bodies never carry stack traces, file paths or Python internals, including an unexpected
  exception whose message names a file.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.reliability.support import (
    StreamResult,
    check_error_body,
    leaked_slots,
    parse_sse_line,
    post_chat,
    report,
    user,
    wait_idle,
)

KEY = "sk-reliability-secret"
ROOT = Path(__file__).resolve().parents[2]
JINJA = "{{ 7 * 7 }} {% for x in range(3) %}LOOP{% endfor %} {{ ''.__class__.__mro__ }} {# c #}"


@pytest.fixture(scope="module")
def keyed(real_service):
    from tests.server.conftest import Live

    with Live(real_service, api_key=KEY) as server:
        yield server


def _sse(response: httpx.Response) -> StreamResult:
    res = StreamResult(response.status_code)
    for line in response.text.splitlines():
        parse_sse_line(line, res)
    return res


def test_api_key_guards_every_route_but_health(keyed, real_service, idle_engine):
    base = keyed.base_url
    chat = {"messages": user("hi"), "max_tokens": 3, "temperature": 0}
    routes = [
        ("POST", "/v1/chat/completions", chat),
        ("POST", "/v1/chat/completions", {**chat, "stream": True}),
        ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3}),
        ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3, "stream": True}),
        ("GET", "/v1/models", None),
        ("GET", "/metrics", None),
    ]
    bad_headers = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                   {"Authorization": "Bearer"}, {"Authorization": f"Bearer {KEY}x"}, {"X-Api-Key": KEY}]
    counts: Counter = Counter()
    with httpx.Client(base_url=base, timeout=120) as client:
        for method, path, body in routes:
            for headers in bad_headers:
                r = client.request(method, path, json=body, headers=headers)
                counts["sent"] += 1
                counts[f"{r.status_code // 100}xx"] += 1
                assert r.status_code == 401, (path, headers, r.status_code, r.text[:200])
                assert r.headers["content-type"].startswith("application/json")  # not an SSE stream
                assert check_error_body(r.json(), path)["type"] == "authentication_error"
            r = client.request(method, path, json=body, headers={"Authorization": f"Bearer {KEY}"})
            counts["sent"] += 1
            counts[f"{r.status_code // 100}xx"] += 1
            assert r.status_code == 200, (path, r.text[:300])
            counts["completed"] += 1
            if body and body.get("stream"):
                assert r.headers["content-type"].startswith("text/event-stream")
                res = _sse(r)
                assert res.done and res.error is None, r.text[-300:]
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
    report("api key", counts, leaked_slots=leaked_slots(wait_idle(real_service.engine)))
    assert counts["5xx"] == 0


def test_jinja_in_messages_and_tool_descriptions_is_text(real_service, live_real, idle_engine, monkeypatch):
    engine = real_service.engine
    tok = real_service.tokenizer
    seen: list[list[int]] = []
    generate = engine.generate

    def spy(request):
        seen.append(list(request.prompt_ids))
        return generate(request)

    monkeypatch.setattr(engine, "generate", spy)
    tool = {"type": "function", "function": {"name": "lookup", "description": "Looks up " + JINJA,
                                             "parameters": {"type": "object", "properties": {
                                                 "q": {"type": "string", "description": JINJA}}}}}
    body = {"messages": [{"role": "system", "content": JINJA}, *user("Hi " + JINJA)], "tools": [tool],
            "max_tokens": 3, "temperature": 0}
    r = post_chat(live_real.base_url, body)
    assert r.status_code == 200, r.text
    assert len(seen) == 1
    prompt = tok.decode(seen[0], skip_special_tokens=False)
    # the system message, the user message, the tool description and the parameter description: all literal
    assert prompt.count("{{ 7 * 7 }}") >= 3, prompt
    assert prompt.count("{% for x in range(3) %}LOOP{% endfor %}") >= 3
    assert "LOOPLOOPLOOP" not in prompt and "49" not in prompt and "<class" not in prompt
    assert "{# c #}" in prompt


HOSTILE = {
    "mro": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals": "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "lipsum": "{{ lipsum.__globals__['os'].popen('touch MARKER').read() }}",
    "message attr": "{% for m in messages %}{{ m.__class__.__init__.__globals__ }}{% endfor %}",
    "self": "{{ self.__init__.__globals__.__builtins__.open('MARKER', 'w') }}",
    "setattr": "{% set x = messages.append(1) %}{{ messages }}",
    "format": "{{ '%s' % ''.__class__ }}",
    "request": "{{ raise_exception.__globals__ }}",
}


def test_hostile_templates_fail_cleanly(real_service, idle_engine, tmp_path, monkeypatch):
    from jaxchat.api import ChatService
    from tests.server.conftest import Live

    monkeypatch.chdir(tmp_path)
    counts: Counter = Counter()
    outcomes = {}
    for name, template in HOSTILE.items():
        marker = tmp_path / f"pwned-{len(outcomes)}"
        template = template.replace("MARKER", str(marker))
        try:
            service = ChatService(real_service.engine, "hostile", None, chat_template=template)
        except Exception as exc:  # refused at load time: also clean
            outcomes[name] = f"refused at load: {type(exc).__name__}"
            assert not marker.exists()
            continue
        with Live(service) as live:
            for stream in (False, True):
                r = post_chat(live.base_url, {"messages": user("hi"), "max_tokens": 2, "stream": stream})
                counts["sent"] += 1
                counts[f"{r.status_code // 100}xx"] += 1
                assert r.status_code in (400, 500), (name, r.status_code, r.text[:300])
                check_error_body(r.json(), name)
                outcomes[name] = r.status_code
        assert not marker.exists(), name
    assert not list(tmp_path.iterdir())
    stats = wait_idle(real_service.engine)
    report("hostile templates", counts, outcomes=outcomes, leaked_slots=leaked_slots(stats))
    assert leaked_slots(stats) == 0


def test_serve_binds_localhost_by_default(real_service):
    import inspect

    from jaxchat.cli import _parser
    from jaxchat.server.run import make_server, serve

    assert _parser().parse_args(["serve"]).host == "127.0.0.1"
    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    assert make_server(real_service, port=0).config.host == "127.0.0.1"
    out = subprocess.run([sys.executable, "-m", "jaxchat.cli", "serve", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "127.0.0.1" in out.stdout, out.stdout
    # the live `jaxchat serve` of test_sigterm.py checks the socket it really bound (/proc/net/tcp)


def test_error_bodies_never_leak_internals(real_service, live_real, idle_engine, monkeypatch):
    """Every kind of error the server produces, scanned for tracebacks, paths and Python internals."""
    base = live_real.base_url
    bodies = []
    with httpx.Client(base_url=base, timeout=60) as c:
        bodies.append(c.post("/v1/chat/completions", content=b"{", headers={"content-type": "application/json"}))
        bodies.append(c.post("/v1/chat/completions", content=b"\xff\xfe", headers={"content-type": "application/json"}))
        bodies.append(c.post("/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]}))
        bodies.append(c.post("/v1/chat/completions", json={"messages": user("x"), "model": "gpt-17"}))
        bodies.append(c.post("/v1/chat/completions", json={"messages": user("x"), "tools": [{"type": "function",
                             "function": {"name": "a b"}}]}))
        bodies.append(c.post("/v1/chat/completions", json={"messages": user("x"), "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": 5}}}))
        bodies.append(c.get("/v1/nope"))
        bodies.append(c.delete("/v1/chat/completions"))
        bodies.append(c.post("/v1/completions", json={"prompt": [-1, 2]}))

        def boom(body):
            raise OSError(f"[Errno 2] No such file: '{ROOT}/jaxchat/secret.py'")

        monkeypatch.setattr(real_service.chats, "answer", boom)
        bodies.append(c.post("/v1/chat/completions", json={"messages": user("x"), "max_tokens": 2}))
    statuses = Counter(r.status_code for r in bodies)
    for r in bodies:
        assert 400 <= r.status_code < 600, r.status_code
        check_error_body(r.json(), f"{r.request.method} {r.request.url.path} -> {r.status_code}")
    assert statuses[500] == 1
    report("error bodies", Counter(sent=len(bodies), **{"4xx": sum(v for k, v in statuses.items() if k < 500),
                                                      "5xx": statuses[500]}), statuses=dict(statuses))


def test_stream_error_chunk_does_not_leak_exception_text(real_service, live_real, idle_engine, monkeypatch):
    """An exception inside the engine (here the detokeniser) whose message names a file must not reach the
    client verbatim: a non-streamed request gets the generic 500 text, a streamed one must too."""
    from tests.reliability.test_faults import _arm_detok_bomb

    _arm_detok_bomb(monkeypatch, message=f"cannot read '{ROOT}/jaxchat/engine/tokenizer.py'")
    body = {"messages": user("DETOKBOMB hi"), "max_tokens": 16, "temperature": 0, "frequency_penalty": 1.5}
    plain = post_chat(live_real.base_url, body)
    assert plain.status_code == 500
    check_error_body(plain.json(), "plain")
    streamed = _sse(post_chat(live_real.base_url, {**body, "stream": True}))
    assert streamed.error is not None and streamed.done
    check_error_body({"error": streamed.error}, "stream error chunk")
    assert leaked_slots(wait_idle(real_service.engine)) == 0
