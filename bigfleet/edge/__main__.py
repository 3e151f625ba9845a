"""``python -m bigfleet.edge``: one edge process of a shard (its engine process starts it)."""

from __future__ import annotations

import sys

from bigfleet.edge.process import main

if __name__ == "__main__":
    sys.exit(main())
