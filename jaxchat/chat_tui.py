"""`jaxchat chat`: a terminal chat against a loaded model or a running server.

Contract: reads user lines from stdin until EOF or `/quit`; streams the reply, showing reasoning dimmed,
content as is and tool calls as `-> name(arguments)`; keeps the conversation history.
"""

from __future__ import annotations

import json
import sys

DIM, RESET, CYAN = "\x1b[2m", "\x1b[0m", "\x1b[36m"


def _server_chunks(url: str, api_key: str | None, body: dict):
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.stream("POST", url.rstrip("/") + "/chat/completions", json=body, headers=headers, timeout=None) as r:
        if r.status_code != 200:
            r.read()
            raise SystemExit(f"jaxchat: server error {r.status_code}: {r.text}")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


def render_stream(chunks, out=sys.stdout) -> dict:
    """Print a streamed reply; return the assistant message it adds up to."""
    message: dict = {"role": "assistant", "content": "", "tool_calls": []}
    for chunk in chunks:
        if "error" in chunk:
            out.write(f"\n[error] {chunk['error'].get('message')}\n")
            break
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            if delta.get("reasoning_content"):
                out.write(DIM + delta["reasoning_content"] + RESET)
            if delta.get("content"):
                out.write(delta["content"])
                message["content"] += delta["content"]
            for call in delta.get("tool_calls") or []:
                if call.get("id"):
                    message["tool_calls"].append({"id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}})
                    out.write(f"\n{CYAN}-> {call['function']['name']}(")
                message["tool_calls"][call["index"]]["function"]["arguments"] += call["function"].get("arguments", "")
                out.write(call["function"].get("arguments", ""))
            if choice.get("finish_reason") == "tool_calls":
                out.write(")" + RESET)
        out.flush()
    out.write("\n")
    if not message["tool_calls"]:
        del message["tool_calls"]
    return message


def run_chat(args, tools) -> int:
    llm = None
    if not args.url:
        from jaxchat.llm import LLM

        llm = LLM(args.model, max_batch=args.max_batch, max_context=args.max_context, dtype=args.dtype,
                  quantize=args.quantize)
        print(f"{DIM}model {llm.model_id}, chat format {llm.chat_format}; /quit to leave{RESET}")
    history: list[dict] = []
    for line in sys.stdin:
        line = line.strip()
        if line in ("/quit", "/exit"):
            break
        if not line:
            continue
        history.append({"role": "user", "content": line})
        body = {"model": getattr(llm, "model_id", "default"), "messages": history, "stream": True}
        if tools:
            body["tools"] = tools
        chunks = llm.chat(history, tools=tools, stream=True) if llm else _server_chunks(args.url, args.api_key, body)
        history.append(render_stream(chunks))
    if llm is not None:
        llm.close()
    return 0
