"""OpenAI's Chat Completions and Completions APIs on the serving pipeline: one adapter each.

Contract: `chat_completions.ChatCompletions` answers `/v1/chat/completions` (a `jaxchat.api.ChatRequest`),
`completions.TextCompletions` answers `/v1/completions` (a `jaxchat.api.CompletionRequest`); both are
`jaxchat.server.WireApi`s (`answer(request)` / `stream(request)`). `custom_calls` streams a custom tool's
input in Chat Completions' chunk shape. The typed requests and the shapes these write are the package's
shared ones (`jaxchat.api.request`, `jaxchat.api.shapes`): the other wire APIs are read into them.
"""
