"""A token bucket that schedules rather than refuses.

Clouds meter instance launches per account (a bucket refilling at about two
instances a second). A provider that hits the limit does not fail the Create:
it queues the launch until a token is free, and the wait counts against the
Create's deadline like any other latency. `TokenBucket.reserve` answers "when
may this launch start", using the generic cell rate algorithm: one token per
``1/rate`` seconds, up to ``burst`` at once.
"""

from __future__ import annotations


class TokenBucket:
    """Per-account launch meter in real seconds of the provider's scheduler."""

    def __init__(self, per_second: float, burst: int) -> None:
        if per_second <= 0 or burst < 1:
            raise ValueError("a token bucket needs a positive rate and a burst of at least 1")
        self.per_second = per_second
        self.burst = burst
        self._theoretical_arrival = 0.0

    def reserve(self, now: float, time_factor: float = 1.0) -> float:
        """Take one token and return the time at which it is available
        (``now`` when the bucket is not empty). ``time_factor`` compresses
        the refill interval like every other simulated duration."""
        interval = time_factor / self.per_second
        tolerance = (self.burst - 1) * interval
        start = max(now, self._theoretical_arrival - tolerance)
        self._theoretical_arrival = max(self._theoretical_arrival, start) + interval
        return start


__all__ = ["TokenBucket"]
