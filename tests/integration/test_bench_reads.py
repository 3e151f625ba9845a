"""``python -m bench reads`` runs end to end and prints one JSON line per figure."""

from __future__ import annotations

import json

import pytest

from bench import reads


def test_the_reads_benchmark_prints_each_way_and_the_speed_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert reads.main(["--machines", "20", "--round-trip-ms", "0", "1", "--runs", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    metrics = [(line["metric"], line["round_trip_ms"]) for line in lines]
    ways = ["one_after_another_ms", "one_after_another_per_machine_us"]
    ways += ["read_many_ms", "read_many_per_machine_us", "speedup"]
    assert metrics == [(m, rt) for rt in (0.0, 1.0) for m in ways]
    assert all(line["bench"] == "reads" and line["machines"] == 20 for line in lines)
    assert all(line["value"] > 0 for line in lines)


def test_bad_arguments_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        reads.main(["--machines", "0"])
    assert "--machines: 0 is not a positive count" in capsys.readouterr().err
