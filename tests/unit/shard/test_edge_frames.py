"""The edge link's frames: a validated roll-up survives the trip, a bad frame says what is wrong."""

from __future__ import annotations

import asyncio
import dataclasses
import marshal
import struct
from typing import Any

import pytest

from bigfleet.shard.frames import (
    HEADER,
    MAX_BODY,
    FrameError,
    Kind,
    decode,
    encode,
    inspection_body,
    inspection_from_body,
    need_from_tuple,
    need_to_tuple,
    read_frame,
    rollup_body,
    rollup_from_body,
)
from bigfleet.shard.shardread import need_view
from shard_engine.engine import ShardEngine
from shard_engine.model import (
    AppClass,
    MachineState,
    Need,
    Operator,
    Requirement,
    Rollup,
    TopologySpread,
    WhenUnsatisfiable,
)
from shard_engine.needs import ValidatedRollup
from shard_engine.verdicts import Inspection, NeedVerdict
from tests.rollups import apply
from tests.unit.engine.engine_fleet import GI, machine


def _needs() -> tuple[Need, ...]:
    zone = Requirement("topology.kubernetes.io/zone", Operator.IN, ("us-east-1a", "us-east-1b"))
    return (
        Need(
            requirements=(zone,),
            aggregate={"cpu": 8.0, "memory": 32 * 2.0**30},
            priority=500_000,
            min_unit={"cpu": 2.0},
            spread=(TopologySpread("topology.kubernetes.io/zone", 1),),
            interruption_penalty=float("inf"),
            reclamation_penalty=4.0,
            app_class=AppClass.LATENCY_SENSITIVE,
            do_not_disrupt_seconds=600.0,
        ),
        # Two rows with one key are one need on the wire's terms: merged by check.
        Need(requirements=(), aggregate={"cpu": 1.0}, priority=7),
        Need(requirements=(), aggregate={"cpu": 2.0}, priority=7),
    )


def _validated(stamp: int = 1) -> ValidatedRollup:
    rollup = Rollup(
        "c1", stamp, _needs(), reported_nodes=frozenset({"n1", "n2"}), release=frozenset({"m1"})
    )
    return ValidatedRollup.check(rollup)


def _through_the_wire(frame: bytes) -> tuple[Kind, tuple[object, ...]]:
    length, kind = HEADER.unpack(frame[: HEADER.size])
    assert length == len(frame) - HEADER.size
    return decode(kind, frame[HEADER.size :])


def test_a_validated_rollup_arrives_as_the_same_merged_needs_with_their_keys() -> None:
    validated = _validated()
    kind, body = _through_the_wire(encode(Kind.ROLLUP, rollup_body(validated, unchanged=False)))
    assert kind is Kind.ROLLUP
    relayed = rollup_from_body(body)
    assert relayed.cluster_id == "c1" and relayed.timestamp_ns == 1
    assert relayed.reported_nodes == frozenset({"n1", "n2"})
    assert relayed.release == frozenset({"m1"})
    assert relayed.needs == dict(validated.merged)
    assert list(relayed.needs) == list(validated.merged)  # the keys, in the edge's order
    assert not relayed.replay


def test_a_need_keeps_every_field_through_its_tuple() -> None:
    for need in _validated().merged.values():
        assert need_from_tuple(need_to_tuple(need)) == need
    gang = Need(
        requirements=(Requirement("rack", Operator.SAME),),
        aggregate={"cpu": 4.0},
        priority=1,
        spread=(TopologySpread("rack", 2, WhenUnsatisfiable.SCHEDULE_ANYWAY),),
        gang=3,
    )
    assert need_from_tuple(need_to_tuple(gang)) == gang
    named = dataclasses.replace(gang, gang=0, gang_name="train-000803")
    assert need_from_tuple(need_to_tuple(named)) == named


def test_an_unchanged_resend_carries_no_needs_and_a_replay_says_so() -> None:
    validated = _validated()
    relayed = rollup_from_body(
        _through_the_wire(encode(Kind.ROLLUP, rollup_body(validated, unchanged=True, replay=True)))[
            1
        ]
    )
    assert relayed.needs is None
    assert relayed.replay


def test_the_engine_applies_a_relayed_rollup_as_the_one_the_edge_judged() -> None:
    relayed = rollup_from_body(
        _through_the_wire(encode(Kind.ROLLUP, rollup_body(_validated(), unchanged=False)))[1]
    )
    assert relayed.needs is not None
    rollup = Rollup(
        relayed.cluster_id,
        relayed.timestamp_ns,
        tuple(relayed.needs.values()),
        relayed.reported_nodes,
        relayed.release,
    )
    engine, judged_here = ShardEngine(), ShardEngine()
    assert engine.apply_rollup(ValidatedRollup.relayed(rollup, relayed.needs), now=0.0).status == (
        "applied"
    )
    judged_here.apply_rollup(_validated(), now=0.0)
    assert engine.needs_of("c1") == judged_here.needs_of("c1")


def test_an_unknown_kind_is_named() -> None:
    with pytest.raises(FrameError, match="unknown frame kind 99"):
        decode(99, b"")


def test_a_body_that_does_not_decode_names_the_frame() -> None:
    good = encode(Kind.OPENED, ("c1",))
    with pytest.raises(FrameError, match="OPENED frame: the body does not decode"):
        decode(Kind.OPENED, good[HEADER.size : -2])


def test_a_body_of_the_wrong_shape_says_how_many_fields_it_has() -> None:
    frame = encode(Kind.ADMIT, (1,))
    with pytest.raises(FrameError, match="ADMIT frame: 1 fields, expected 2"):
        _through_the_wire(frame)
    with pytest.raises(FrameError, match="SEND frame: the body is a list"):
        decode(Kind.SEND, marshal.dumps(["c1", b"", ""]))


def test_a_rollup_with_a_bad_need_or_cluster_is_refused_with_the_reason() -> None:
    body = list(rollup_body(_validated(), unchanged=False))
    with pytest.raises(FrameError, match="cluster id is not a non-empty string"):
        rollup_from_body(("", *body[1:]))
    with pytest.raises(FrameError, match="timestamp is not an integer"):
        rollup_from_body((body[0], "1", *body[2:]))
    with pytest.raises(FrameError, match="a need does not decode"):
        rollup_from_body((*body[:4], (("k", ("too", "short")),), False))
    with pytest.raises(FrameError, match="release is not a set of names"):
        rollup_from_body((*body[:3], ["m1"], *body[4:]))


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_frames_are_read_one_after_another_until_the_channel_ends() -> None:
    reader = _reader(encode(Kind.OPENED, ("c1",)) + encode(Kind.STOP, ()))
    assert await read_frame(reader) == (Kind.OPENED, ("c1",))
    assert await read_frame(reader) == (Kind.STOP, ())
    assert await read_frame(reader) is None


async def test_a_channel_that_ends_inside_a_frame_says_where() -> None:
    frame = encode(Kind.OPENED, ("c1",))
    with pytest.raises(FrameError, match=r"inside a frame header \(3 of 5 bytes\)"):
        await read_frame(_reader(frame[:3]))
    with pytest.raises(FrameError, match=r"ended after 2 of \d+ body bytes"):
        await read_frame(_reader(frame[: HEADER.size + 2]))


async def test_an_oversized_length_is_refused_before_reading_the_body() -> None:
    header = struct.pack(">IB", MAX_BODY + 1, int(Kind.ROLLUP))
    with pytest.raises(FrameError, match="at most"):
        await read_frame(_reader(header))


def test_a_need_sent_again_unchanged_decodes_to_the_very_object_built_before() -> None:
    sent: dict[str, Any] = {}
    built: dict[str, Any] = {}
    first = _validated(1)
    body = rollup_body(first, unchanged=False, memo=sent)
    before = rollup_from_body(body, built).needs
    # One need resized: the others keep their values, and so their objects.
    changed = Rollup(
        "c1", 2, (_needs()[0], Need(requirements=(), aggregate={"cpu": 5.0}, priority=7))
    )
    second = ValidatedRollup.check(changed, first)
    after = rollup_from_body(rollup_body(second, unchanged=False, memo=sent), built).needs
    assert before is not None and after is not None
    [kept] = [k for k in after if k in before and after[k] is before[k]]
    assert after[kept] == second.merged[kept]
    assert len(after) == 2 and len(built) == 2


def test_a_need_sent_as_before_to_an_engine_that_never_saw_it_is_refused() -> None:
    sent: dict[str, Any] = {}
    rollup_body(_validated(1), unchanged=False, memo=sent)
    body = rollup_body(_validated(2), unchanged=False, memo=sent)  # all "as before"
    with pytest.raises(FrameError, match="is 'as before' but none was"):
        rollup_from_body(body, {})


# ------------------------------------------------------------------ why-not


def _inspection() -> Inspection:
    """An engine's answer after one cycle: met by preemption, unmet, and left to starve."""
    engine = ShardEngine()
    for i in range(3):
        engine.upsert_machine(
            machine(f"low-{i}", state=MachineState.CONFIGURED, cluster="batch", price=0.2), now=0
        )
    engine.upsert_machine(machine("idle-0", price=0.2), now=0)
    apply(engine, Rollup("batch", 1, (Need((), {"cpu": 12.0}, priority=10),)), now=0)
    web = Need((), {"cpu": 8.0, "memory": 8 * GI}, priority=1_000_000)
    apply(engine, Rollup("web", 1, (web,)), now=0)
    gpus = Need((), {"nvidia.com/gpu": 2.0}, priority=500, min_unit={"nvidia.com/gpu": 1.0})
    apply(engine, Rollup("ml", 1, (gpus,)), now=0)
    engine.cycle(now=100.0)
    return engine.inspect_needs()


def test_an_engines_inspection_arrives_equal_and_makes_the_same_need_views() -> None:
    answer = _inspection()
    assert {v.cluster_id for v in answer.verdicts} == {"web", "ml", "batch"}
    assert any(v.matching is not None for v in answer.verdicts)
    assert any(v.victims for v in answer.verdicts) and any(v.deficit for v in answer.verdicts)

    kind, body = _through_the_wire(encode(Kind.INSPECTED, (7, inspection_body(answer), "")))
    assert kind is Kind.INSPECTED and body[0] == 7 and body[2] == ""
    assert isinstance(body[1], tuple)
    arrived = inspection_from_body(body[1])

    assert arrived == answer
    assert [need_view(v) for v in arrived.verdicts] == [need_view(v) for v in answer.verdicts]


def test_every_field_of_a_verdict_travels() -> None:
    """A field added to NeedVerdict must be added to the frame too, or this fails."""
    [values] = inspection_body(_inspection())[3][:1]
    assert len(values) == len(dataclasses.fields(NeedVerdict))


def test_an_empty_answer_and_a_question_survive_the_trip() -> None:
    empty = Inspection(cycle=0, computed_at=0.0, total=0, verdicts=())
    assert inspection_from_body(inspection_body(empty)) == empty
    assert _through_the_wire(encode(Kind.INSPECT, (3, "c1", 10))) == (Kind.INSPECT, (3, "c1", 10))
    assert _through_the_wire(encode(Kind.INSPECTED, (3, None, "ValueError: no"))) == (
        Kind.INSPECTED,
        (3, None, "ValueError: no"),
    )
    with pytest.raises(FrameError, match="INSPECT frame: 2 fields, expected 3"):
        _through_the_wire(encode(Kind.INSPECT, (3, "c1")))


def test_an_answer_that_does_not_fit_is_refused_naming_the_frame() -> None:
    cycle, at, total, verdicts = inspection_body(_inspection())
    first = list(verdicts[0])
    with pytest.raises(FrameError, match="INSPECTED frame: the answer does not decode"):
        inspection_from_body((cycle, at, total))
    with pytest.raises(FrameError, match="INSPECTED frame: the answer does not decode"):
        inspection_from_body((cycle, at, total, list(verdicts)))
    with pytest.raises(FrameError, match="INSPECTED frame: a verdict's cluster id is not a string"):
        inspection_from_body((cycle, at, total, ((None, *first[1:]),)))
    with pytest.raises(FrameError, match="INSPECTED frame: a need does not decode"):
        inspection_from_body((cycle, at, total, ((*first[:2], ("short",), *first[3:]),)))


def test_a_shards_default_edge_socket_is_named_after_its_session_port() -> None:
    from bigfleet.shard.relay import default_socket

    primary = default_socket("shard-0", "0.0.0.0:7443")
    standby = default_socket("shard-0", "0.0.0.0:7444")
    assert primary != standby, "a standby on the primary's host has a socket of its own"
    assert primary == default_socket("shard-0", "[::]:7443"), "any host, one port: one socket"
    assert "shard-0-7443-" in primary
    assert default_socket("shard-0", "127.0.0.1:0") == default_socket("shard-0")
