"""The dev stack the end-to-end tests run: one shard, a small simulated cloud, fast loops."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from bigfleet.devstack import DevStackOptions
from clusters.operator import DemandPattern


def one_shard(
    data_dir: Path,
    database_url: str,
    clusters: tuple[tuple[str, DemandPattern], ...],
    **changes: Any,
) -> DevStackOptions:
    """A one-shard stack serving ``clusters`` on loopback (ephemeral ports, no UI, nothing
    persisted), its provider at a hundredth of real latencies; ``changes`` as for
    :func:`dataclasses.replace`."""
    base = DevStackOptions(
        data_dir=data_dir,
        database_url=database_url,
        temporal_port=0,
        ui=False,
        shard_listen="127.0.0.1:0",
        time_factor=0.01,
        cycle_interval_s=0.3,
        observe_interval_s=0.3,
        rollup_interval_s=0.5,
        clusters=clusters,
        quota_scale=0.2,
        persist=False,
    )
    return replace(base, **changes)


__all__ = ["one_shard"]
