"""OpenAI's Responses API on the serving pipeline: its reader, its adapter and the shapes it writes.

Contract: `request.parse_responses_request(body, limits, max_context)` reads a `/v1/responses` body into a
`ResponsesRequest` around the pipeline's `ChatRequest` (every 400 named); `adapter.ResponsesApi` answers it
(a `jaxchat.server.WireApi`); `shapes` writes the `response` object and its stream's events.
"""
