"""Every BigFleet Prometheus metric, defined in one place, and the endpoint that serves them.

Names follow ``bigfleet_<subsystem>_<what>_<unit>``: counters end in
``_total``, durations are histograms in ``_seconds``, gauges carry no suffix
beyond their unit. Labels are few and bounded (shard ids, action kinds,
reasons, gRPC methods and codes, workflow types) — never a machine or
cluster id, so a fleet of half a million machines is still a few hundred
series.

Each process serves them with :func:`serve` on ``BIGFLEET_METRICS_LISTEN``
(``host:port``): the shard, the coordinator, the provider servers, the dev
stack (all of them in one process). The Temporal SDK's own metrics (task
latencies, poller counts, workflow completions by type) come from the SDK's
Prometheus exporter on a separate address (``BIGFLEET_TEMPORAL_METRICS_LISTEN``,
see :func:`bigfleet.temporal.runtime`).

Alert-worthy queries and the Grafana dashboard are in ``docs/metrics.md``
and ``deploy/grafana/bigfleet.json``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

__all__ = [
    "ACTIONS",
    "COORDINATOR_INSTRUCTIONS",
    "COORDINATOR_ROUNDS",
    "COORDINATOR_TERM",
    "CYCLE_SECONDS",
    "DECISIONS_DROPPED",
    "DECISIONS_WRITTEN",
    "DRAINS_HELD",
    "GC_PAUSE_MAX",
    "GC_PAUSE_SECONDS",
    "IDENTITY_REFUSALS",
    "LEASE_EPOCH",
    "LEASE_HELD",
    "PHASE_SECONDS",
    "PROVIDER_CALLS",
    "PROVIDER_CALL_SECONDS",
    "PROVIDER_FENCED",
    "PROVIDER_REQUESTS",
    "PROVIDER_REQUEST_SECONDS",
    "RECLAIMS_CAPPED",
    "RECONCILE_REPAIRS",
    "ROLLUPS",
    "SESSIONS_OPEN",
    "SESSIONS_SHED",
    "SESSION_LOOP_BUSY",
    "SESSION_LOOP_LAG",
    "SHARD_DRY_RUN",
    "SHARD_PAUSED",
    "SHARD_SHADOW",
    "SHORTFALLS",
    "UNMET_NEEDS",
    "WORKFLOW_FAILURES",
    "WORKFLOW_STARTS",
    "MetricsServer",
    "ProviderCallMetrics",
    "ProviderRequestMetrics",
    "serve",
]

# Cycle durations: a 500K-machine shard's steady cycle is ~25 ms, a burst ~100 ms.
_CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Provider calls cross a network and a cloud API: milliseconds to tens of seconds.
_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# -- shard: the decision cycle ----------------------------------------------------------

CYCLE_SECONDS = Histogram(
    "bigfleet_shard_cycle_duration_seconds",
    "Wall time of one decision cycle (engine only, not carrying the plan out)",
    ["shard"],
    buckets=_CYCLE_BUCKETS,
)
PHASE_SECONDS = Histogram(
    "bigfleet_shard_cycle_phase_duration_seconds",
    "Wall time of each stage of the decision cycle",
    ["shard", "phase"],
    buckets=_CYCLE_BUCKETS,
)
ACTIONS = Counter(
    "bigfleet_shard_actions_total",
    "Actions the cycle decided, by kind and (for drains, deletes, recoveries) reason",
    ["shard", "kind", "reason"],
)
UNMET_NEEDS = Gauge(
    "bigfleet_shard_unmet_needs",
    "Needs still short after the last cycle, by why-not reason",
    ["shard", "reason"],
)
SHORTFALLS = Gauge(
    "bigfleet_shard_shortfalls",
    "Shortfalls the shard reports to the coordinator (at most 100), and of those escalated",
    ["shard", "escalated"],
)
RECLAIMS_CAPPED = Counter(
    "bigfleet_shard_reclaims_capped_total",
    "Excess machines left for a later cycle by the per-cluster reclaim rate cap",
    ["shard"],
)
ROLLUPS = Counter(
    "bigfleet_shard_rollups_total",
    "Acknowledged roll-ups, each once, by final outcome: applied, quarantined, stale, rejected, "
    "superseded (replaced by a newer one before it was applied), departed, deferred",
    ["shard", "outcome"],
)
SESSIONS_SHED = Counter(
    "bigfleet_session_shed_total",
    "Sessions refused or ended with RESOURCE_EXHAUSTED, by reason",
    ["reason"],
)
SESSIONS_OPEN = Gauge(
    "bigfleet_shard_sessions_open",
    "Cluster operator sessions currently open on the shard",
    ["shard"],
)
# The loops that acknowledge roll-ups: 'thread' (the Session port a thread of the shard
# process) or 'edge-N' (edge processes, reported to the engine over their link).
SESSION_LOOP_LAG = Gauge(
    "bigfleet_session_loop_lag_seconds",
    "How late the loop serving cluster sessions runs (a 10 ms timer's lateness, smoothed)",
    ["shard", "loop"],
)
SESSION_LOOP_BUSY = Gauge(
    "bigfleet_session_loop_busy_ratio",
    "Share of the last second the loop serving cluster sessions was not waiting for I/O",
    ["shard", "loop"],
)
GC_PAUSE_SECONDS = Counter(
    "bigfleet_gc_pause_seconds",
    "Time Python's cyclic garbage collector held the interpreter, per process of the shard "
    "('engine', or 'edge-N')",
    ["shard", "process"],
)
GC_PAUSE_MAX = Gauge(
    "bigfleet_gc_pause_max_seconds",
    "The longest garbage-collector pause since the last report, per process of the shard",
    ["shard", "process"],
)
LEASE_HELD = Gauge(
    "bigfleet_shard_lease_held",
    "1 while this process holds the shard's lease and acts, 0 while it stands by",
    ["shard"],
)
LEASE_EPOCH = Gauge(
    "bigfleet_shard_lease_epoch",
    "Epoch of the shard's lease as this process last held it (fences provider calls)",
    ["shard"],
)

# -- shard: safe adoption (pause, dry run, shadow, budgets, decision log) -----------------

SHARD_PAUSED = Gauge(
    "bigfleet_shard_paused",
    "1 while an operator's pause is in force on this shard (nothing new starts)",
    ["shard"],
)
SHARD_DRY_RUN = Gauge(
    "bigfleet_shard_dry_run",
    "1 while the shard plans in dry run (decisions recorded, nothing started)",
    ["shard"],
)
SHARD_SHADOW = Gauge(
    "bigfleet_shard_shadow",
    "1 when the process runs in shadow mode (BIGFLEET_MODE=shadow): it never acts",
    ["shard"],
)
DRAINS_HELD = Counter(
    "bigfleet_shard_drains_held_total",
    "Drains a cycle wanted and held back, by cause (budget, do-not-disrupt)",
    ["shard", "cause"],
)
DECISIONS_WRITTEN = Counter(
    "bigfleet_decisions_written_total",
    "Decision log rows written to PostgreSQL",
    ["shard"],
)
DECISIONS_DROPPED = Counter(
    "bigfleet_decisions_dropped_total",
    "Decision log rows dropped unwritten because the buffer was full (PostgreSQL slow or down)",
    ["shard"],
)

# -- workflows ---------------------------------------------------------------------------

WORKFLOW_STARTS = Counter(
    "bigfleet_workflow_starts_total",
    "Machine workflows started (a start that found the running one is not counted)",
    ["type", "reason"],
)
WORKFLOW_FAILURES = Counter(
    "bigfleet_workflow_failures_total",
    "Workflows that could not be started, or that ended with their machine FAILED",
    ["type", "stage"],
)

# -- provider calls (client side, in the shard) -------------------------------------------

PROVIDER_CALLS = Counter(
    "bigfleet_provider_client_calls_total",
    "CapacityProvider calls made, by provider, method and gRPC status code",
    ["provider", "method", "code"],
)
PROVIDER_CALL_SECONDS = Histogram(
    "bigfleet_provider_client_call_duration_seconds",
    "Latency of CapacityProvider calls as the caller saw it",
    ["provider", "method"],
    buckets=_CALL_BUCKETS,
)

# -- provider server side (in the provider process) ------------------------------------------

PROVIDER_REQUESTS = Counter(
    "bigfleet_provider_requests_total",
    "CapacityProvider requests served, by method and gRPC status code",
    ["provider", "method", "code"],
)
PROVIDER_REQUEST_SECONDS = Histogram(
    "bigfleet_provider_request_duration_seconds",
    "Time to serve one CapacityProvider request",
    ["provider", "method"],
    buckets=_CALL_BUCKETS,
)
PROVIDER_FENCED = Counter(
    "bigfleet_provider_fenced_total",
    "Mutations refused because their (epoch, sequence) was stale (FAILED_PRECONDITION)",
    ["provider", "method"],
)

# -- coordinator -----------------------------------------------------------------------------

COORDINATOR_ROUNDS = Counter(
    "bigfleet_coordinator_rounds_total",
    "Planning rounds the coordinator finished, by result",
    ["result"],
)
COORDINATOR_INSTRUCTIONS = Counter(
    "bigfleet_coordinator_instructions_total",
    "Instructions the coordinator sent to shards, by kind",
    ["kind"],
)
COORDINATOR_TERM = Gauge(
    "bigfleet_coordinator_term",
    "The coordinator term this process runs under",
)

# -- faults: reconcile ------------------------------------------------------------------------

RECONCILE_REPAIRS = Counter(
    "bigfleet_reconcile_repairs_total",
    "Differences between the providers, the ownership record and the engine that the "
    "shard's reconcile loop repaired (or, for unowned and vanished machines, reported).",
    ["kind"],
)

# -- identity (mutual TLS) ----------------------------------------------------------------------

IDENTITY_REFUSALS = Counter(
    "bigfleet_identity_refusals_total",
    "Calls refused because of the caller's certificate identity",
    ["service", "reason"],
)


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; ``address`` is where it listens."""

    address: str
    _server: WSGIServer

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        self._server.shutdown()
        self._server.server_close()


def serve(listen: str, *, registry: CollectorRegistry = REGISTRY) -> MetricsServer:
    """Serve ``/metrics`` on ``listen`` (``host:port``; port 0 picks a free one).

    Raises ``ValueError`` naming ``BIGFLEET_METRICS_LISTEN`` when the
    address has no port, and ``OSError`` when the port is taken.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"BIGFLEET_METRICS_LISTEN: {listen!r} is not HOST:PORT")
    server, _thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
    bound = server.server_address[1]
    address = f"{host or '0.0.0.0'}:{bound}"
    log.info("serving metrics on http://%s/metrics", address)
    return MetricsServer(address, server)


# -- gRPC interceptors: provider calls measured on both ends ------------------------------------


# grpc's interceptor classes are generic only to the type checker.
if TYPE_CHECKING:
    _ClientInterceptor = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ClientInterceptor = grpc.aio.UnaryUnaryClientInterceptor
    _ServerInterceptor = grpc.aio.ServerInterceptor


def _method_name(method: str | bytes) -> str:
    text = method.decode() if isinstance(method, bytes) else method
    return text.rsplit("/", 1)[-1]


class ProviderCallMetrics(_ClientInterceptor):
    """Counts and times every unary call a ``ProviderClient`` makes to one provider."""

    def __init__(self, provider: str) -> None:
        self.provider = provider

    async def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        method = _method_name(client_call_details.method)
        started = time.perf_counter()
        code = "UNKNOWN"
        try:
            call = await continuation(client_call_details, request)
            await call
            code = (await call.code()).name
            return call
        except grpc.aio.AioRpcError as error:
            code = error.code().name
            raise
        finally:
            PROVIDER_CALLS.labels(self.provider, method, code).inc()
            PROVIDER_CALL_SECONDS.labels(self.provider, method).observe(
                time.perf_counter() - started
            )


class ProviderRequestMetrics(_ServerInterceptor):
    """Counts, times and notes fenced refusals of the requests a provider server answers."""

    def __init__(self, provider: str) -> None:
        self.provider = provider

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = _method_name(handler_call_details.method)
        if method == "Check" or method.startswith("ServerReflection"):
            return handler
        inner: Any = handler.unary_unary
        provider = self.provider

        async def measured(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            try:
                return await inner(request, context)
            finally:
                status = context.code()
                code = status.name if isinstance(status, grpc.StatusCode) else "OK"
                PROVIDER_REQUESTS.labels(provider, method, code).inc()
                PROVIDER_REQUEST_SECONDS.labels(provider, method).observe(
                    time.perf_counter() - started
                )
                if status == grpc.StatusCode.FAILED_PRECONDITION:
                    PROVIDER_FENCED.labels(provider, method).inc()

        return grpc.unary_unary_rpc_method_handler(
            measured,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
