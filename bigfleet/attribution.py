"""The keys of the attribution a shard stamps into a machine's ``shard_metadata``.

When a shard configures a machine it stores, with the provider, which shard
did it, for which need and priority, and under which operation sequence
(``activities.machines``); it reads the need and priority back when it
lists the machine (``bigfleet.shard.observer``). The simulator stamps and
reads the same keys on its virtual providers, so it must spell them the way
production does. They are defined once, here, in a leaf that imports
nothing: activities may import it without climbing into the application,
and the simulator without importing the activities (both are forbidden by
import contracts; ``pyproject.toml``).
"""

from __future__ import annotations

__all__ = ["META_NEED", "META_OPERATION_SEQ", "META_PRIORITY", "META_SHARD"]

META_SHARD = "bigfleet.io/shard"
"""The shard that configured the machine."""
META_NEED = "bigfleet.io/need"
"""The key of the need the machine was configured for (``Need.key``)."""
META_PRIORITY = "bigfleet.io/priority"
"""That need's priority, a decimal int32."""
META_OPERATION_SEQ = "bigfleet.io/operation-seq"
"""The operation sequence of the configure that stamped it (ADR 0102)."""
