"""Workflow tests run on the time-skipping Temporal test server from its wheel."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.workflows.rig import time_skipping_server


@pytest.fixture(scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    async with time_skipping_server() as env:
        yield env
