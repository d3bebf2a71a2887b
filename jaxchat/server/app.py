"""The OpenAI-compatible Starlette app: routes, auth, errors and metrics around an injected ServingBackend.

Contract
--------
`create_app(service, api_key=None, limits=Limits())` (`service` a `ServingBackend`, checked with `isinstance`:
a TypeError otherwise) returns a Starlette app with
`POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses` (the Responses API) and
`POST /v1/messages` (the Anthropic Messages API, with Anthropic error bodies and no `[DONE]`; each of these two
is a 404 when the service's `responses` / `anthropic` adapter is None) (JSON, or SSE with `stream: true`): one
table, `routes.WIRE_ROUTES`, and one handler for them all, which hands the typed request to the route's adapter;
`GET /v1/models`, `GET /health` (`{"status": "ok"}`, with `programs_ready` / `programs_total` when the service's
stats have them: the server listens once the engine's first programs are ready, the others compile in the
background) and `GET /metrics` (Prometheus text). Every request body goes
through `read_json_object` (size, content type, UTF-8, JSON, depth) and is read once by
`jaxchat.api.parse_chat_request` / `parse_completion_request` / `parse_responses_request` /
`parse_messages_request` (every 400) into the typed request the
service takes; a `model` other than `service.model_id` is a 404 `model_not_found`
(an absent `model` means the served one). With an `api_key`, every route but `/health` needs
`Authorization: Bearer <key>` (on `/v1/messages`, as Anthropic's SDK sends it, `x-api-key: <key>` too;
compared in constant time), else 401. Every error, including unknown
routes (404) and wrong methods (405), is an OpenAI error body (on `/v1/messages` an Anthropic one); unexpected exceptions are logged
and answered with a generic 500. A client that disconnects cancels its request (streamed or not).
`app.state.drain` is the shutdown coordinator `jaxchat.server.run` drives on SIGTERM; `app.state.metrics`
holds the per-app registry.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jaxchat.api import Limits, messages_error_json
from jaxchat.server.body import read_json_object
from jaxchat.server.errors import ApiError, error_for_exception
from jaxchat.server.metrics import CONTENT_TYPE, Metrics
from jaxchat.server.protocol import ServingBackend
from jaxchat.server.routes import ANTHROPIC_ROUTE, WIRE_ROUTES, WireRoute
from jaxchat.server.sse import ClientGone, Drain, SSEStream, run_until_gone

__all__ = ["create_app"]

log = logging.getLogger("jaxchat.server")


class _Api:
    def __init__(self, service: ServingBackend, api_key: str | None, limits: Limits) -> None:
        self.service = service
        self.key = api_key.encode("utf-8") if api_key else None
        self.limits = limits
        self.metrics = Metrics(service)
        self.drain = Drain()
        self.created = int(time.time())

    # ---- plumbing --------------------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        if self.key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        anthropic = request.url.path == ANTHROPIC_ROUTE
        if not header and anthropic and "x-api-key" in request.headers:  # the Anthropic SDK's header
            scheme, token = "bearer", request.headers["x-api-key"]
        elif not header:
            how = "'Authorization: Bearer <key>' or 'x-api-key: <key>'" if anthropic else "'Authorization: Bearer <key>'"
            raise ApiError(
                401,
                f"missing API key: send it as {how}",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        given = token.strip().encode("latin-1", "replace")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given, self.key):
            raise ApiError(
                401, "incorrect API key provided", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
            )

    def check_model(self, body: object) -> None:
        """A `model` naming another model is a 404; its type is the request reader's to check (400)."""
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str) and model != self.service.model_id:
            raise ApiError(
                404,
                f"The model {model[:200]!r} does not exist; this server serves {self.service.model_id!r}",
                param="model",
                code="model_not_found",
            )

    def endpoint(self, handler: Callable[[Request, float], Awaitable[Response]], public: bool = False,
                 error_shape: Callable[[ApiError], dict] = ApiError.body):
        async def run(request: Request) -> Response:
            started = time.monotonic()
            try:
                if not public:
                    self.authorize(request)
                if self.drain.draining and request.url.path.startswith("/v1/"):
                    raise ApiError(503, self.drain.message, code="server_shutdown")
                response = await handler(request, started)
            except ClientGone:
                self.metrics.disconnects.inc()
                self.metrics.observe_request(request.url.path, 499, time.monotonic() - started)
                return Response(status_code=499)
            except Exception as exc:  # noqa: BLE001 - the HTTP boundary: every failure becomes an error body
                err = error_for_exception(exc, request.url.path)
                response = JSONResponse(error_shape(err), status_code=err.status, headers=err.headers)
            if not isinstance(response, SSEStream):
                self.metrics.observe_request(request.url.path, response.status_code, time.monotonic() - started)
            return response

        return run

    def stream(self, request: Request, chunks, started: float, arrival=None, **sse) -> SSEStream:
        path = request.url.path
        self.metrics.streams_active.inc()

        def on_end(status, usage, ttft, decode, tokens, gone) -> None:
            if arrival is not None:  # submitted by now, or never will be
                arrival.close()
            self.metrics.streams_active.dec()
            if gone:
                self.metrics.disconnects.inc()
            self.metrics.observe_usage(usage)
            if status == 200:
                self.metrics.observe_stream_timing(ttft, decode, tokens)
            self.metrics.observe_request(path, 499 if gone and status == 200 else status, time.monotonic() - started)

        return SSEStream(chunks, self.drain, on_end, started, **sse)

    async def generate(self, request: Request, started: float, parse, complete, complete_stream, **sse) -> Response:
        arrival = self.service.expect_request()  # an idle engine gathering a burst waits for it
        streaming = False
        try:
            body = await read_json_object(request, self.limits)
            self.check_model(body)  # before validation, as vLLM does: a wrong model is a 404 whatever else is wrong
            typed = parse(body, self.limits, self.service.max_context)
            if typed.stream:
                response = self.stream(request, complete_stream(typed), started, arrival=arrival, **sse)
                streaming = True  # from here the stream's end closes the arrival
                return response
            result = await run_until_gone(request.receive, complete(typed), self.drain)
        finally:
            if arrival is not None and not streaming:
                arrival.close()
        self.metrics.observe_usage(result.get("usage") if isinstance(result, dict) else None)
        return JSONResponse(result)

    # ---- routes ----------------------------------------------------------------------------------
    def wire(self, route: WireRoute) -> Callable[[Request, float], Awaitable[Response]]:
        """The handler of a generation route (`routes.WIRE_ROUTES`)."""
        sse = {"done": False, "error_shape": _anthropic_error} if route.anthropic else {}

        async def handler(request: Request, started: float) -> Response:
            adapter = route.adapter_of(self.service)
            if adapter is None:
                raise ApiError(404, f"this server's service does not implement the {route.api}")
            return await self.generate(request, started, route.read, adapter.answer, adapter.stream, **sse)

        return handler

    async def models(self, request: Request, started: float) -> Response:
        card = {
            "id": self.service.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "jaxchat",
            "max_model_len": self.service.max_context,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Request, started: float) -> Response:
        body: dict = {"status": "draining" if self.drain.draining else "ok"}
        try:
            stats = self.service.stats()
        except Exception:  # noqa: BLE001  (health answers whatever the stats do)
            stats = {}
        body.update({k: stats[k] for k in ("programs_ready", "programs_total") if k in stats})
        return JSONResponse(body, status_code=503 if self.drain.draining else 200)

    async def prometheus(self, request: Request, started: float) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)


def _anthropic_error(err: ApiError) -> dict:
    return messages_error_json(err.status, err.message, err.param)


def create_app(service: ServingBackend, api_key: str | None = None, limits: Limits | None = None) -> Starlette:
    if not isinstance(service, ServingBackend):
        raise TypeError(f"{type(service).__name__} does not implement jaxchat.server.ServingBackend")
    api = _Api(service, api_key, limits or Limits())
    routes = [Route(route.path, api.endpoint(api.wire(route), error_shape=_anthropic_error if route.anthropic
                                             else ApiError.body), methods=["POST"]) for route in WIRE_ROUTES]
    routes += [
        Route("/v1/models", api.endpoint(api.models), methods=["GET"]),
        Route("/health", api.endpoint(api.health, public=True), methods=["GET"]),
        Route("/metrics", api.endpoint(api.prometheus), methods=["GET"]),
    ]

    async def http_error(request: Request, exc: HTTPException) -> Response:
        status = exc.status_code
        message = {404: f"no route {request.url.path[:200]!r}", 405: f"method {request.method} is not allowed here"}
        err = ApiError(status, message.get(status, str(exc.detail)))
        api.metrics.observe_request(request.url.path, status)
        return JSONResponse(err.body(), status_code=status, headers=exc.headers or {})

    async def unexpected(request: Request, exc: Exception) -> Response:
        err = error_for_exception(exc, request.url.path)
        return JSONResponse(err.body(), status_code=err.status)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: unexpected})
    app.state.api = api
    app.state.drain = api.drain
    app.state.metrics = api.metrics
    return app
