"""Hostile operators against a real shard: property-based fuzzing of the Session wire.

A real :class:`ShardProcess` (PostgreSQL, a Temporal worker on the dev
server, its cycle running every 0.2 s) serves ``Shard/Session``
over loopback gRPC. Hypothesis sends it Hellos with arbitrary cluster ids,
roll-ups with overflowing quantities, NUL bytes, over-long and blank names,
unknown enums and timestamps far in the future, bootstrap answers and
reclaim acks with hostile text, and raw bytes that may not decode at all.

What must hold, whatever arrives:

- every stream ends with OK or INVALID_ARGUMENT, never UNKNOWN or INTERNAL,
  and nothing is logged with a traceback;
- a rejected roll-up is answered ``rollup-rejected: <wire field>: <reason>``
  and the cluster's needs in force are exactly what they were before it;
- an accepted roll-up leaves the shard holding what a second engine (the
  model) holds after the same sequence of roll-ups;
- afterwards the shard still opens a session and acknowledges a roll-up.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bigfleet.shard.convert import InvalidRollup, rollup_from_wire
from bigfleet.shard.process import ShardOptions, ShardProcess
from bigfleet.shard.sessions import hello_problem
from bigfleet.store import Database, Store
from bigfleet.temporal import start_dev_server
from bigfleet.v1alpha1 import capacity_pb2, shard_pb2
from shard_engine.engine import ShardEngine
from shard_engine.names import cluster_id_problem
from shard_engine.needs import RollupRejected
from tests.rollups import apply

CLUSTER = "fuzz-c1"
SESSION = "/bigfleet.v1alpha1.Shard/Session"
# "rollup-rejected: needs[0].requirements[1].values[2]: <reason>"
REJECTED = re.compile(r"^rollup-rejected: [a-z_]+(\[[^\]\n]*\])?(\.[a-z_]+(\[[^\]\n]*\])?)*: .+")
T = TypeVar("T")
EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)


@dataclass
class Served:
    shard: ShardProcess
    store: Store
    channel: grpc.aio.Channel
    # The model: a second engine fed the same roll-ups the shard accepted.
    model: ShardEngine = field(default_factory=ShardEngine)

    def open(self) -> grpc.aio.StreamStreamCall[bytes, shard_pb2.ShardMessage]:
        """A Session call that sends raw bytes, so frames need not be valid messages."""
        method = self.channel.stream_stream(
            SESSION,
            request_serializer=lambda b: b,
            response_deserializer=shard_pb2.ShardMessage.FromString,
        )
        return method()  # type: ignore[call-arg]  # (grpc.aio takes no iterator here)


@pytest.fixture
async def served(empty_database_url: str) -> AsyncIterator[Served]:
    env = await start_dev_server(ui=False)
    db = Database.connect(empty_database_url)
    await db.migrate()
    store = Store(db.engine)
    shard = ShardProcess(
        ShardOptions(shard_id="shard-0", listen="127.0.0.1:0", cycle_interval_s=0.2),
        store=store,
        temporal=env.client,
        providers={},
    )
    await shard.start()
    channel = grpc.aio.insecure_channel(shard.address)
    try:
        yield Served(shard, store, channel)
    finally:
        await channel.close(None)
        await shard.stop()
        await db.close()
        await env.shutdown()


# ------------------------------------------------------------------ strategies

HOSTILE_TEXT = st.one_of(
    st.text(max_size=80),
    st.sampled_from(
        ["", " ", "\t", "\x00", "cpu\x00", "a\x00b", "x" * 10_000, "Ä", "\u202e", "../..", "-a"]
    ),
)
NAMES = st.one_of(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), HOSTILE_TEXT)
QUANTITIES = st.one_of(
    st.from_regex(r"[0-9]{1,4}(\.[0-9]{1,3})?(m|k|Ki|Mi|Gi)?", fullmatch=True),
    st.sampled_from(
        ["1e400", "1e-400", "-1", "nan", "inf", "9Ei", "8Ei", "1e" + "9" * 50, "1e-10", "0.5n"]
    ),
    HOSTILE_TEXT,
)
INT32 = st.integers(-(2**31), 2**31 - 1)
ENUMS = st.integers(-3, 40)


@st.composite
def requirements(draw: st.DrawFn) -> capacity_pb2.NodeSelectorRequirement:
    return capacity_pb2.NodeSelectorRequirement(
        key=draw(st.one_of(st.sampled_from(["topology.kubernetes.io/zone", "gpu"]), HOSTILE_TEXT)),
        operator=draw(ENUMS),  # type: ignore[arg-type]
        values=draw(st.lists(HOSTILE_TEXT, max_size=3)),
    )


@st.composite
def hostile_needs(draw: st.DrawFn) -> capacity_pb2.CapacityNeed:
    return capacity_pb2.CapacityNeed(
        requirements=draw(st.lists(requirements(), max_size=2)),
        aggregate_resources=draw(st.dictionaries(NAMES, QUANTITIES, max_size=3)),
        priority=draw(INT32),
        spread=[
            capacity_pb2.TopologySpread(
                topology_key=draw(HOSTILE_TEXT),
                max_skew=draw(INT32),
                when_unsatisfiable=draw(ENUMS),  # type: ignore[arg-type]
            )
            for _ in range(draw(st.integers(0, 1)))
        ],
        interruption_penalty_bucket=draw(ENUMS),  # type: ignore[arg-type]
        reclamation_penalty_bucket=draw(ENUMS),  # type: ignore[arg-type]
        min_unit=draw(st.dictionaries(NAMES, QUANTITIES, max_size=2)),
    )


@st.composite
def good_needs(draw: st.DrawFn) -> capacity_pb2.CapacityNeed:
    cpu = draw(st.integers(1, 64))
    return capacity_pb2.CapacityNeed(
        aggregate_resources={"cpu": str(cpu), "memory": f"{cpu * 4}Gi"},
        min_unit={"cpu": "1"},
        priority=draw(st.sampled_from([100, 1000, 50_000])),
        requirements=[
            capacity_pb2.NodeSelectorRequirement(
                key="topology.kubernetes.io/zone",
                operator=1,  # type: ignore[arg-type]
                values=["zone-a"],
            )
        ]
        if draw(st.booleans())
        else [],
        interruption_penalty_bucket=draw(st.integers(0, 27)),  # type: ignore[arg-type]
    )


# A roll-up's stamp: seconds relative to the sender's clock when it is sent, or
# an absolute int64. Offsets stay clear of the 300 s skew bound by seconds, so
# the shard and the model (whose clocks read a few milliseconds apart) agree.
STAMPS = st.one_of(
    st.tuples(st.just("relative"), st.sampled_from([0, 0, 0, 1, -1, -600, 60, 290, 310, 10**7])),
    st.tuples(st.just("absolute"), st.integers(-(2**63), 2**63 - 1)),
)


@dataclass(frozen=True)
class RollupFrame:
    needs: tuple[capacity_pb2.CapacityNeed, ...]
    cluster_id: str
    stamp: tuple[str, int]

    def message(self) -> shard_pb2.OperatorMessage:
        kind, value = self.stamp
        ns = time.time_ns() + value * 10**9 if kind == "relative" else value
        return shard_pb2.OperatorMessage(
            rollup=capacity_pb2.ClusterCapacityNeeds(
                cluster_id=self.cluster_id, timestamp_unix_nanos=ns, needs=self.needs
            )
        )


@dataclass(frozen=True)
class RawFrame:
    data: bytes


FRAMES = st.one_of(
    st.builds(
        RollupFrame,
        needs=st.lists(good_needs(), max_size=3).map(tuple),
        cluster_id=st.sampled_from([CLUSTER, ""]),
        stamp=st.just(("relative", 0)),
    ),
    st.builds(
        RollupFrame,
        needs=st.lists(st.one_of(hostile_needs(), good_needs()), max_size=3).map(tuple),
        cluster_id=st.one_of(st.sampled_from([CLUSTER, ""]), HOSTILE_TEXT),
        stamp=STAMPS,
    ),
    st.binary(max_size=64).map(RawFrame),
    st.builds(
        lambda rid, err, data: RawFrame(
            shard_pb2.OperatorMessage(
                bootstrap_response=shard_pb2.BootstrapBlobResponse(
                    request_id=rid, error=err, user_data=data
                )
            ).SerializeToString()
        ),
        HOSTILE_TEXT,
        HOSTILE_TEXT,
        st.binary(max_size=32),
    ),
    st.builds(
        lambda iid, n: RawFrame(
            shard_pb2.OperatorMessage(
                reclaim_ack=shard_pb2.ReclaimAck(instruction_id=iid, nodes_started=n)
            ).SerializeToString()
        ),
        HOSTILE_TEXT,
        INT32,
    ),
    st.builds(
        lambda cid: RawFrame(
            shard_pb2.OperatorMessage(hello=shard_pb2.Hello(cluster_id=cid)).SerializeToString()
        ),
        HOSTILE_TEXT,
    ),
)


# ------------------------------------------------------------------ the session


def _hello(cluster_id: str) -> bytes:
    return shard_pb2.OperatorMessage(
        hello=shard_pb2.Hello(cluster_id=cluster_id, protocol_version="v1alpha1")
    ).SerializeToString()


async def _ack(call: grpc.aio.StreamStreamCall[bytes, shard_pb2.ShardMessage]) -> str:
    """The echo of the next acknowledgement (other frames are skipped)."""
    while True:
        frame = await asyncio.wait_for(call.read(), timeout=60)
        assert frame is not EOF, "the stream ended where an answer was due"
        assert isinstance(frame, shard_pb2.ShardMessage)
        if frame.WhichOneof("payload") == "ack":
            return frame.ack.echo


async def _drain(call: grpc.aio.StreamStreamCall[bytes, shard_pb2.ShardMessage]) -> str:
    """Read to the end of the stream; the first ack's echo (if any)."""
    echo = ""
    try:
        while (frame := await asyncio.wait_for(call.read(), timeout=60)) is not EOF:
            assert isinstance(frame, shard_pb2.ShardMessage)
            echo = echo or frame.ack.echo
    except grpc.aio.AioRpcError:
        pass  # the status is read from the call
    return echo


class Operator:
    """One hostile operator: sends frames, checks every answer against the model."""

    def __init__(self, served: Served, cluster: str = CLUSTER) -> None:
        self.served = served
        self.cluster = cluster
        self.call: grpc.aio.StreamStreamCall[bytes, shard_pb2.ShardMessage] | None = None

    async def connect(self) -> grpc.aio.StreamStreamCall[bytes, shard_pb2.ShardMessage]:
        call = self.served.open()
        await call.write(_hello(self.cluster))
        assert await _ack(call) == "hello"
        self.call = call
        return call

    async def finish(self) -> None:
        if self.call is not None:
            await self.call.done_writing()
            assert await asyncio.wait_for(self.call.read(), timeout=60) is EOF
            assert await self.call.code() == grpc.StatusCode.OK
            self.call = None

    async def send(self, frame: RollupFrame | RawFrame) -> None:
        call = self.call or await self.connect()
        if isinstance(frame, RollupFrame):
            await self._rollup(call, frame.message())
            return
        try:
            decoded = shard_pb2.OperatorMessage.FromString(frame.data)
        except DecodeError:
            await call.write(frame.data)
            # One undecodable frame ends the stream with INVALID_ARGUMENT.
            await _drain(call)
            assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "does not decode" in (await call.details() or "")
            self.call = None
            return
        kind = decoded.WhichOneof("payload")
        if kind == "rollup":
            await self._rollup(call, decoded)
        else:
            await call.write(frame.data)
            if kind == "hello":
                assert (await _ack(call)).startswith("hello-ignored")

    async def _rollup(
        self,
        call: grpc.aio.StreamStreamCall[bytes, shard_pb2.ShardMessage],
        msg: shard_pb2.OperatorMessage,
    ) -> None:
        engine, model = self.served.shard.engine, self.served.model
        before = engine.needs_of(self.cluster)
        await call.write(msg.SerializeToString())
        echo = await _ack(call)
        # The ack does not wait for the engine (roll-ups are staged in an intake);
        # apply what was staged before reading the needs in force.
        self.served.shard.sink.apply_staged()
        after = engine.needs_of(self.cluster)
        try:
            rollup = rollup_from_wire(msg.rollup, session_cluster=self.cluster)
            apply(model, rollup, now=time.time())
        except (InvalidRollup, RollupRejected):
            assert REJECTED.match(echo), echo
            assert after == before, "a rejected roll-up changed the needs in force"
            return
        assert not echo.startswith("rollup-rejected"), echo
        assert after == model.needs_of(self.cluster)


def _in_loop(loop: asyncio.AbstractEventLoop) -> Callable[[Coroutine[Any, Any, T]], T]:
    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=300)

    return run


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing logged with a traceback or at ERROR, garbage from earlier tests aside.

    When streaming calls of earlier tests in the same process are collected,
    asyncio reports their request generators ("destroyed but it is pending",
    "aclose(): asynchronous generator is already running"). That is grpc's
    client bookkeeping, not the shard's answer to anything sent here, so
    those records are the ones ignored.
    """
    noise = ("_StreamRequestMixin", "asynchronous generator is already running")
    # A shard process another module leaked (named in its messages as "shard
    # shard-N: ...") is not this shard: only this shard's answers count here.
    own = "shard shard-0:"

    def elsewhere(message: str) -> bool:
        return message.startswith("shard shard-") and not message.startswith(own)

    bad = [
        r
        for r in caplog.records
        if (r.exc_info or r.levelno >= logging.ERROR)
        and not (r.name == "asyncio" and any(n in r.getMessage() for n in noise))
        and not elsewhere(r.getMessage())
    ]
    assert not bad, [r.getMessage()[:300] for r in bad]


async def _still_serving(served: Served, cluster: str = CLUSTER) -> None:
    """A fresh session opens and a good roll-up is acknowledged and applied."""
    operator = Operator(served, cluster)
    call = await operator.connect()
    await call.write(
        RollupFrame(
            needs=(
                capacity_pb2.CapacityNeed(
                    aggregate_resources={"cpu": "4", "memory": "16Gi"}, priority=7
                ),
            ),
            cluster_id=cluster,
            stamp=("relative", 0),
        )
        .message()
        .SerializeToString()
    )
    assert await _ack(call) == "rollup"
    served.shard.sink.apply_staged()
    assert [n.priority for n in served.shard.engine.needs_of(cluster)] == [7]
    await operator.finish()


# ------------------------------------------------------------------ the properties


async def test_hostile_frames_never_break_the_session_or_the_needs_in_force(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    run = _in_loop(asyncio.get_running_loop())
    # A good roll-up in force before the first hostile frame, in the shard and the model.
    first = Operator(served)
    await first.send(
        RollupFrame(
            needs=(
                capacity_pb2.CapacityNeed(
                    aggregate_resources={"cpu": "4", "memory": "16Gi"}, priority=7
                ),
            ),
            cluster_id=CLUSTER,
            stamp=("relative", 0),
        )
    )
    await first.finish()
    assert served.shard.engine.needs_of(CLUSTER) == served.model.needs_of(CLUSTER) != ()

    @settings(
        max_examples=200,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(frames=st.lists(FRAMES, min_size=1, max_size=6))
    def a_session_of(frames: list[RollupFrame | RawFrame]) -> None:
        async def session() -> None:
            operator = Operator(served)
            for frame in frames:
                await operator.send(frame)
            await operator.finish()

        run(session())

    await asyncio.to_thread(a_session_of)
    await _still_serving(served, "fuzz-after")
    assert served.shard.active
    _no_tracebacks(caplog)


async def test_a_hello_opens_a_session_only_for_a_usable_cluster_id(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    run = _in_loop(asyncio.get_running_loop())

    async def hello(data: bytes) -> tuple[grpc.StatusCode, str, str]:
        call = served.open()
        await call.write(data)
        await call.done_writing()
        echo = await _drain(call)
        return await call.code(), await call.details() or "", echo

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        cluster_id=st.one_of(
            HOSTILE_TEXT, st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True)
        )
    )
    def hello_with(cluster_id: str) -> None:
        code, details, echo = run(hello(_hello(cluster_id)))
        if cluster_id_problem(cluster_id) is None:
            assert (code, echo) == (grpc.StatusCode.OK, "hello")
        else:
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert details.startswith("hello.cluster_id: ") and len(details) < 800

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.binary(max_size=64))
    def first_frame(data: bytes) -> None:
        code, details, echo = run(hello(data))
        try:
            message = shard_pb2.OperatorMessage.FromString(data)
        except DecodeError:
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert "does not decode" in details
            return
        if message.WhichOneof("payload") == "hello" and hello_problem(message.hello) is None:
            assert (code, echo) == (grpc.StatusCode.OK, "hello")
        else:
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details

    await asyncio.to_thread(hello_with)
    await asyncio.to_thread(first_frame)
    # Refused ids never reached PostgreSQL.
    for assignment in await served.store.clusters():
        assert cluster_id_problem(assignment.cluster_id) is None
    _no_tracebacks(caplog)


# ------------------------------------------------------------------ the cases


async def test_a_hello_with_an_unusable_cluster_id_is_invalid_and_reaches_no_table(
    served: Served,
) -> None:
    cases = [
        ("c1\x00", "control character"),
        ("x" * 10_000, "10000 characters"),
        ("   ", "only whitespace"),
        ("", "must not be empty"),
    ]
    for cluster_id, reason in cases:
        call = served.open()
        await call.write(_hello(cluster_id))
        await call.done_writing()
        await _drain(call)
        assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = await call.details() or ""
        assert details.startswith("hello.cluster_id: ") and reason in details, details
        assert len(details) < 300
    assert await served.store.clusters() == []


async def test_an_undecodable_frame_ends_the_stream_with_one_log_line_and_no_traceback(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    operator = Operator(served)
    call = await operator.connect()
    caplog.clear()
    await call.write(b"\xff\xff\xff\x0f not a message")
    await _drain(call)
    assert await call.code() == grpc.StatusCode.INVALID_ARGUMENT
    lines = [r for r in caplog.records if "does not decode" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    _no_tracebacks(caplog)
    await _still_serving(served)


async def test_one_bad_clock_cannot_freeze_a_cluster(served: Served) -> None:
    operator = Operator(served)
    call = await operator.connect()

    async def rollup(cpu: str, stamp_ns: int) -> str:
        await call.write(
            shard_pb2.OperatorMessage(
                rollup=capacity_pb2.ClusterCapacityNeeds(
                    cluster_id=CLUSTER,
                    timestamp_unix_nanos=stamp_ns,
                    needs=[capacity_pb2.CapacityNeed(aggregate_resources={"cpu": cpu})],
                )
            ).SerializeToString()
        )
        return await _ack(call)

    assert await rollup("2", time.time_ns()) == "rollup"
    served.shard.sink.apply_staged()
    year_ahead = time.time_ns() + 365 * 24 * 3600 * 10**9
    echo = await rollup("64", year_ahead)
    assert echo.startswith("rollup-rejected: timestamp_unix_nanos: ")
    assert "ahead of the shard's clock" in echo and "300 s" in echo
    served.shard.sink.apply_staged()
    assert served.shard.engine.needs_of(CLUSTER)[0].aggregate == {"cpu": 2.0}
    # The cluster's next roll-up from a good clock is applied, not stale.
    assert await rollup("3", time.time_ns()) == "rollup"
    served.shard.sink.apply_staged()
    assert served.shard.engine.needs_of(CLUSTER)[0].aggregate == {"cpu": 3.0}
    await operator.finish()
