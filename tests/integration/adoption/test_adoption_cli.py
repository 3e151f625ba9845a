"""pause, dry-run, resume, shards, why and shadow report from the command line, on the real
PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from bigfleet.cli import app
from bigfleet.decisions import Decision
from bigfleet.store import Database, Store
from bigfleet.store.controls import ControlStore
from bigfleet.store.decisions import DecisionStore

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "shadow"
T0 = datetime(2026, 12, 1, 3, 0, tzinfo=UTC).timestamp()


async def _cli(db: Database, *args: str, env: dict[str, str] | None = None) -> Result:
    runner = CliRunner()
    return await asyncio.to_thread(
        runner.invoke, app, list(args), env={"BIGFLEET_DATABASE_URL": db.url, **(env or {})}
    )


@pytest.fixture
async def shards(database: Database) -> Store:
    store = Store(database.engine)
    await store.acquire_lease("shard-0", "proc-a", ttl_seconds=300)
    await store.acquire_lease("shard-1", "proc-b", ttl_seconds=300)
    return store


def _line(output: str, first: str) -> str:
    return next(line for line in output.splitlines() if line.split()[:1] == [first])


async def test_pause_is_stored_and_shown_by_shards_then_resume_lifts_it(
    database: Database, shards: Store
) -> None:
    paused = await _cli(database, "pause", "--shard", "shard-0", "--reason", "incident 7")
    listed = await _cli(database, "shards")
    await _cli(database, "resume", "--shard", "shard-0")
    after = await _cli(database, "shards")

    assert paused.exit_code == 0, paused.output
    assert "shard shard-0: paused — incident 7" in paused.output
    assert (await ControlStore(database.engine).get("shard-0")).paused is False
    assert _line(listed.output, "shard-0").split()[5] == "paused"
    assert "paused: incident 7" in listed.output
    assert _line(listed.output, "shard-1").split()[5] == "active"
    assert _line(after.output, "shard-0").split()[5] == "active"


async def test_pausing_all_shards_and_dry_run_of_one(database: Database, shards: Store) -> None:
    await _cli(database, "dry-run", "--shard", "shard-1", "--reason", "rehearsal")
    await _cli(database, "pause", "--all", "--reason", "freeze")
    listed = await _cli(database, "shards")

    assert _line(listed.output, "shard-0").split()[5] == "paused"
    assert _line(listed.output, "shard-1").split()[5] == "paused"  # pause outranks dry run
    assert (await ControlStore(database.engine).get("shard-1")).dry_run


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pause", "--reason", "x"], "name one shard with --shard S, or every shard with --all"),
        (["pause", "--shard", "s", "--all", "--reason", "x"], "name one shard"),
        (["pause", "--shard", "shard-0"], "reason: say why"),
    ],
)
async def test_pause_refuses_an_unclear_request(
    database: Database, shards: Store, args: list[str], message: str
) -> None:
    result = await _cli(database, *args)

    assert result.exit_code == 2
    assert message in result.output


async def test_why_machine_answers_as_of_an_instant(database: Database) -> None:
    await DecisionStore(database.engine).append(
        [
            Decision(
                "shard-0",
                T0,
                10,
                "active",
                "assign",
                "m-1",
                "c1",
                "k1",
                "idle covers",
                {"instance_type": "m5.large", "price_per_hour": 0.1},
            ),
            Decision(
                "shard-0",
                T0 + 720,
                90,
                "active",
                "reclaim",
                "m-1",
                "c1",
                "",
                "reclaim: excess the cluster's needs stay covered without",
            ),
        ]
    )

    before = await _cli(database, "why", "machine", "m-1", "--at", "2026-12-01T03:05:00Z")
    now = await _cli(database, "why", "machine", "m-1")
    bad = await _cli(database, "why", "machine", "m-1", "--at", "2026-12-01T03:05:00")

    assert before.exit_code == 0, before.output
    assert "assign m-1: idle covers" in before.output
    assert "instance_type=m5.large" in before.output
    assert "reclaim" not in before.output
    assert now.output.index("reclaim m-1") < now.output.index("assign m-1")
    assert bad.exit_code == 2 and "has no time zone" in bad.output


async def test_why_need_finds_holds_and_unmet_verdicts(database: Database) -> None:
    await DecisionStore(database.engine).append(
        [Decision("shard-0", T0, 3, "paused", "unmet", "", "web", "0123abcd99", "actuation paused")]
    )

    result = await _cli(database, "why", "need", "web/0123abcd")
    malformed = await _cli(database, "why", "need", "web")

    assert "unmet web/0123abcd99: actuation paused [paused: not carried out]" in result.output
    assert malformed.exit_code == 2 and "is not CLUSTER/NEED_KEY" in malformed.output


async def test_shadow_report_and_convert_from_the_command_line(
    database: Database, tmp_path: Path
) -> None:
    await DecisionStore(database.engine).append(
        [
            Decision(
                "shard-0",
                datetime(2026, 12, 1, 0, 0, tzinfo=UTC).timestamp(),
                1,
                "shadow",
                "provision",
                "m-a",
                "web",
                "K1",
                "short",
                {"instance_type": "m5.large", "capacity_type": "spot", "price_per_hour": 0.04},
            ),
        ]
    )
    converted = tmp_path / "incumbent.jsonl"

    convert = await _cli(
        database,
        "shadow",
        "convert",
        "--kubectl-watch",
        str(FIXTURES / "kubectl-watch.json"),
        "--cluster",
        "web",
    )
    converted.write_text(convert.output)
    report = await _cli(
        database,
        "shadow",
        "report",
        "--incumbent",
        str(converted),
        "--since",
        "2026-12-01T00:00:00Z",
        "--until",
        "2026-12-01T04:00:00Z",
    )

    assert convert.exit_code == 0, convert.output
    assert [json.loads(line)["event"] for line in convert.output.splitlines()] == [
        "join",
        "join",
        "leave",
    ]
    assert report.exit_code == 0, report.output
    # bigfleet: m-a 4 h at $0.04; incumbent: m5.large spot 2 h (priced from ours) + c5.xlarge
    # 3.5 h with no known price.
    assert "cluster web: bigfleet 4.00 machine-h $0.16 | incumbent 5.50 machine-h $0.08" in (
        report.output
    )
    assert "unpriced" in report.output


async def test_budgets_without_a_file_says_how_to_set_them(database: Database) -> None:
    result = await _cli(database, "budgets")

    assert result.exit_code == 0
    assert "BIGFLEET_BUDGETS_FILE" in result.output
