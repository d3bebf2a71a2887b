"""Anthropic's Messages API on the serving pipeline: its reader, its adapter and the shapes it writes.

Contract: `request.parse_messages_request(body, limits, max_context)` reads a `/v1/messages` body into the
pipeline's `ChatRequest` (every 400 named, in Anthropic's terms); `adapter.MessagesApi` answers it (a
`jaxchat.server.WireApi`); `shapes` writes the message, its stream's events and Anthropic's error bodies.
"""
