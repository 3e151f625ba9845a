"""Hellos that arrive together ask for their clusters' shards in one query."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from bigfleet.shard.admissions import Admissions


class Lookups:
    """Answers like the store (the shard per cluster), recording each query."""

    def __init__(self, *, fail: bool = False) -> None:
        self.queries: list[list[str]] = []
        self.fail = fail

    async def __call__(self, cluster_ids: Sequence[str]) -> dict[str, str]:
        self.queries.append(list(cluster_ids))
        await asyncio.sleep(0.01)
        if self.fail:
            raise TimeoutError("the database did not answer")
        return {cid: "shard-1" if cid.endswith("1") else "shard-0" for cid in cluster_ids}


async def test_hellos_arriving_together_share_queries() -> None:
    lookups = Lookups()
    admissions = Admissions(lookups, max_batch=100)
    owners = await asyncio.gather(*(admissions.owner(f"c{i}") for i in range(250)))
    assert owners[1] == "shard-1" and owners[2] == "shard-0"
    assert sum(len(q) for q in lookups.queries) == 250
    assert len(lookups.queries) <= 4  # the first alone, then batches of at most 100


async def test_the_same_cluster_twice_in_a_batch_is_asked_once() -> None:
    lookups = Lookups()
    admissions = Admissions(lookups)
    first, second = await asyncio.gather(admissions.owner("c1"), admissions.owner("c1"))
    assert first == second == "shard-1"
    assert sum(q.count("c1") for q in lookups.queries) <= 2


async def test_a_failed_query_fails_its_waiters_and_the_next_query_still_runs() -> None:
    lookups = Lookups(fail=True)
    admissions = Admissions(lookups)
    with pytest.raises(TimeoutError):
        await admissions.owner("c1")
    lookups.fail = False
    assert await admissions.owner("c2") == "shard-0"
