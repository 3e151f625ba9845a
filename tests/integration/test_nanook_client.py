"""The seed-following scheduler client retries what the seed says, and nothing else."""

from __future__ import annotations

import pytest
from aiohttp import web

from nanook.client import RestScalingClient, ScalingError


async def test_the_rest_client_retries_a_refused_connection_and_a_429_as_the_seed_says() -> None:
    answers = [429, 429]
    calls: list[int] = []

    async def throttled(request: web.Request) -> web.Response:
        calls.append(1)
        if answers:
            return web.json_response(
                {"error": "slow down", "field": "(request)"}, status=answers.pop()
            )
        return web.json_response({"desired": 1, "available": 0, "min": 0})

    app = web.Application()
    app.router.add_get("/scale_config", throttled)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    try:
        state = await RestScalingClient(f"http://127.0.0.1:{port}", sleep=record).scale_config()
        assert state.desired == 1 and len(calls) == 3 and waits == [1.0, 2.0]
    finally:
        await runner.cleanup()
    # Nobody listens any more: four retries, a second longer each time, then it gives up.
    waits.clear()
    with pytest.raises(ScalingError) as caught:
        await RestScalingClient(f"http://127.0.0.1:{port}", sleep=record).scale_config()
    assert caught.value.status == "connect" and waits == [1.0, 2.0, 3.0, 4.0]
