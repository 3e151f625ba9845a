"""`bigfleet dev --shadow`: a demo cluster served in shadow mode beside an active one.

The active cluster gets machines; the shadow shard records what it would
have provisioned for its cluster, and the cloud never receives a mutating
call for a machine the shadow shard holds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bigfleet.devstack import SHADOW_SHARD, DevStack
from bigfleet.store.decisions import DecisionStore
from clusters.operator import DemandPattern
from providers.core import ProviderCore
from tests.e2e.stacks import one_shard
from tests.waiting import eventually

pytestmark = pytest.mark.e2e

ACTIVE = ("e2e-active", DemandPattern(cpu=4, memory_gib=8, priority=500_000))
SHADOW = ("e2e-shadow", DemandPattern(cpu=4, memory_gib=8, priority=300_000))


async def test_a_shadow_cluster_beside_an_active_one(
    tmp_path: Path, empty_database_url: str
) -> None:
    mutated: list[str] = []

    def record(core: ProviderCore) -> None:
        for name in ("create", "configure", "drain", "delete"):
            original = getattr(core, name)

            def call(machine_id: str, *args: Any, _o: Any = original, **kw: Any) -> Any:
                mutated.append(machine_id)
                return _o(machine_id, *args, **kw)

            setattr(core, name, call)

    stack = DevStack(
        one_shard(
            tmp_path,
            empty_database_url,
            (ACTIVE,),
            shadow_clusters=(SHADOW,),
            provider_hook=record,
        )
    )
    await stack.start()
    try:
        assert stack.store is not None and stack.db is not None
        assert [c.shard_id for c in await stack.store.clusters() if c.cluster_id == SHADOW[0]] == [
            SHADOW_SHARD
        ]
        decisions = DecisionStore(stack.db.engine)

        async def shadow_provisions() -> list[str] | None:
            rows = await decisions.window(
                since=datetime(2000, 1, 1, tzinfo=UTC),
                until=datetime(2100, 1, 1, tzinfo=UTC),
                cluster_id=SHADOW[0],
            )
            ids = [d.machine_id for d in rows if d.kind == "provision" and d.mode == "shadow"]
            return ids or None

        would = await eventually(shadow_provisions, within=180, what="shadow provisions")

        async def active_served() -> bool:
            listing = await next(iter(stack.provider_clients.values())).list()
            return any(m.cluster == ACTIVE[0] for m in listing.machines)

        await eventually(active_served, within=180, what="a machine for the active cluster")
        owners = await stack.store.owners()
        shadow_held = {m for m, shard in owners.items() if shard == SHADOW_SHARD}
        assert set(would) <= shadow_held
        assert [m for m in mutated if m in shadow_held] == []
        assert mutated  # the active shard did act
    finally:
        await stack.stop()
