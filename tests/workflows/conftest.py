"""Workflow tests run on the time-skipping Temporal test server from its wheel."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from bigfleet.temporal import start_time_skipping


@pytest.fixture(scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_time_skipping()
    try:
        yield env
    finally:
        await env.shutdown()
