"""Prometheus metrics for one app, in its own `CollectorRegistry` (several apps never share counters).

Contract: `Metrics.render()` returns the text exposition for `GET /metrics`, refreshing the gauges
from `service.stats()` first. Names (all prefixed `jaxchat_`):

* `requests_total{route,status}`: every answered request; routes are the API's paths, anything
  else is counted as `other` so that probing random paths cannot grow the label set;
* `prompt_tokens_total`, `completion_tokens_total`: from the `usage` of every response and stream;
* `time_to_first_token_seconds`: request arrival to the first chunk carrying generated output
  (streams only); `time_per_output_token_seconds`: (last - first chunk) / (completion tokens - 1);
  `request_duration_seconds{route}`: arrival to the end of the response;
* `stream_disconnects_total`: streams the client left early; `streams_active`: open SSE streams;
* gauges from `service.stats()`: `requests_running`, `requests_waiting`, `batch_slots_total`,
  `batch_slots_busy`, `batch_occupancy` (busy / total), `compiles` (XLA compiles in the process, persistent-cache
  loads included), `compile_cache_hits` (those the persistent compilation cache answered), `programs_loaded`
  (step programs loaded as serialized executables: neither traced nor compiled), `programs_ready` and
  `programs_total` (step programs compiled or loaded so far, of all: the others compile in the background),
  `kv_pages_used` and
  `kv_pages_total` (the KV page pool: pages requests hold, and all pages), plus `service_<key>` for any other
  numeric entry;
* `prefix_cache_hit_tokens_total`: prompt tokens the engine reused from its prefix cache; `preemptions_total`:
  requests whose pages were taken back when the pool ran dry (recomputed later);
  `jump_forward_tokens_total`: output tokens a grammar forced, appended without sampling (counters fed from
  the service's running totals `prefix_cache_hit_tokens`, `jump_forward_tokens` and `preemptions`);
  `spec_draft_tokens_total` / `spec_accepted_tokens_total`: tokens drafted by speculative decoding and drafts
  accepted (from `draft_tokens`, `draft_accepted_tokens`); `compiles_on_request_path_total`: compiles a step
  waited on (from `compiles_on_request_path`; stays 0).
"""

from __future__ import annotations

import logging
import re

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jaxchat.server.routes import PATHS

__all__ = ["CONTENT_TYPE", "Metrics"]

log = logging.getLogger("jaxchat.server")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ROUTES = PATHS  # labelled by path; any other path is "other"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
_KNOWN_STATS = {
    "running": "requests_running",
    "waiting": "requests_waiting",
    "slots_total": "batch_slots_total",
    "slots_busy": "batch_slots_busy",
    "compiles": "compiles",
    "compile_cache_hits": "compile_cache_hits",
    "programs_loaded": "programs_loaded",
    "programs_ready": "programs_ready",
    "programs_total": "programs_total",
    "kv_pages_used": "kv_pages_used",
    "kv_pages_total": "kv_pages_total",
}


class Metrics:
    def __init__(self, service) -> None:
        self.service = service
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "jaxchat_requests", "Requests answered, by route and HTTP status", ["route", "status"], registry=r
        )
        self.prompt_tokens = Counter("jaxchat_prompt_tokens", "Prompt tokens processed", registry=r)
        self.completion_tokens = Counter("jaxchat_completion_tokens", "Completion tokens generated", registry=r)
        self.ttft = Histogram(
            "jaxchat_time_to_first_token_seconds",
            "Time to the first generated chunk",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "jaxchat_time_per_output_token_seconds",
            "Time per output token after the first",
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "jaxchat_request_duration_seconds", "Request duration", ["route"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.disconnects = Counter("jaxchat_stream_disconnects", "Streams ended early by the client", registry=r)
        self.streams_active = Gauge("jaxchat_streams_active", "Open SSE streams", registry=r)
        self.occupancy = Gauge("jaxchat_batch_occupancy", "Busy batch slots / total slots", registry=r)
        self._totals = {  # service running totals exported as counters: stat key -> (counter, value seen)
            "prefix_cache_hit_tokens": [Counter("jaxchat_prefix_cache_hit_tokens",
                                                "Prompt tokens reused from the prefix cache", registry=r), 0],
            "jump_forward_tokens": [Counter("jaxchat_jump_forward_tokens",
                                            "Output tokens a grammar forced, appended without sampling",
                                            registry=r), 0],
            "preemptions": [Counter("jaxchat_preemptions", "Requests preempted when the KV pool ran dry",
                                    registry=r), 0],
            "draft_tokens": [Counter("jaxchat_spec_draft_tokens", "Tokens drafted for speculative decoding",
                                     registry=r), 0],
            "draft_accepted_tokens": [Counter("jaxchat_spec_accepted_tokens",
                                              "Drafted tokens the model's own choice confirmed", registry=r), 0],
            "compiles_on_request_path": [Counter("jaxchat_compiles_on_request_path",
                                                 "Compiles a step waited on (stays 0: a step runs only ready "
                                                 "programs)", registry=r), 0],
        }
        self._stat_gauges: dict[str, Gauge] = dict.fromkeys(self._totals)  # counters, not gauges
        for key, name in _KNOWN_STATS.items():
            self._gauge(key, name)

    @staticmethod
    def route_label(path: str) -> str:
        return path if path in ROUTES else "other"

    def observe_request(self, path: str, status: int, seconds: float | None = None) -> None:
        route = self.route_label(path)
        self.requests.labels(route=route, status=str(status)).inc()
        if seconds is not None:
            self.duration.labels(route=route).observe(seconds)

    def observe_usage(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        for key, alt, counter in (("prompt_tokens", "input_tokens", self.prompt_tokens),
                                  ("completion_tokens", "output_tokens", self.completion_tokens)):
            value = usage.get(key, usage.get(alt))  # chat usage, or the Responses / Messages API's
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                counter.inc(value)

    def observe_stream_timing(self, ttft: float | None, decode_seconds: float | None, tokens: int) -> None:
        if ttft is not None:
            self.ttft.observe(ttft)
        if decode_seconds is not None and tokens > 1:
            self.tpot.observe(decode_seconds / (tokens - 1))

    def _gauge(self, key: str, name: str | None = None) -> Gauge | None:
        if key not in self._stat_gauges:
            metric = name or "service_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
            try:
                self._stat_gauges[key] = Gauge(f"jaxchat_{metric}", f"service.stats()['{key}']", registry=self.registry)
            except ValueError:  # a name clash with an existing metric: skip this stat
                self._stat_gauges[key] = None
        return self._stat_gauges[key]

    def refresh(self) -> None:
        try:
            stats = self.service.stats()
        except Exception:
            log.exception("service.stats() failed; /metrics shows the last values")
            return
        if not isinstance(stats, dict):
            return
        for key, value in stats.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(key, str):
                gauge = self._gauge(key)
                if gauge is not None:
                    gauge.set(value)
        for key, seen in self._totals.items():
            value = stats.get(key)
            if isinstance(value, int) and value > seen[1]:
                seen[0].inc(value - seen[1])
                seen[1] = value
        total, busy = stats.get("slots_total"), stats.get("slots_busy")
        if isinstance(total, (int, float)) and isinstance(busy, (int, float)) and total > 0:
            self.occupancy.set(busy / total)

    def render(self) -> bytes:
        self.refresh()
        return generate_latest(self.registry)
