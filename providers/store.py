"""Durable provider state: a JSON snapshot plus an append-only journal.

``PATH`` holds the last snapshot and ``PATH.journal`` every change since, one
JSON line per accepted request or completed transition. A change is written
(and flushed to the operating system) before the request is answered, so a
provider process killed at any instant restarts with everything it
acknowledged. ``fsync=True`` additionally survives power loss. A torn last
line (a kill mid-write) is ignored on load: it was never acknowledged.

The document has three parts: ``meta`` (counters and identity), ``machines``
(id -> record) and ``fences`` ([shard_id, machine_id, epoch, sequence] rows).
Journal lines carry the same parts, partially; replaying them in order over
the snapshot yields the current state. Each snapshot carries a generation and
the journal names the generation it extends, so a journal left behind by a
kill during compaction is never replayed twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

Document = dict[str, Any]


class StateStore:
    """Snapshot + journal persistence at ``path`` (see module docstring)."""

    def __init__(self, path: Path, *, fsync: bool = False, compact_after: int = 5000) -> None:
        self.path = Path(path)
        self.journal_path = self.path.with_name(self.path.name + ".journal")
        self._fsync = fsync
        self._compact_after = compact_after
        self._journal: IO[str] | None = None
        self._lines = 0
        self._generation = 0

    @property
    def needs_compaction(self) -> bool:
        """True once the journal is long enough that a snapshot should absorb it."""
        return self._lines >= self._compact_after

    def load(self) -> Document | None:
        """The stored document with the journal replayed, or None if nothing
        has been stored at this path yet."""
        if not self.path.exists():
            return None
        with self.path.open(encoding="utf-8") as fh:
            doc: Document = json.load(fh)
        self._generation = int(doc.get("generation", 0))
        doc.setdefault("meta", {})
        doc.setdefault("machines", {})
        doc.setdefault("fences", [])
        if self.journal_path.exists():
            fences = {(row[0], row[1]): row for row in doc["fences"]}
            with self.journal_path.open(encoding="utf-8") as fh:
                header_seen = False
                for raw in fh:
                    try:
                        line = json.loads(raw)
                    except json.JSONDecodeError:
                        break  # a torn final write: never acknowledged
                    if not header_seen:
                        header_seen = True
                        if line.get("generation") != self._generation:
                            break  # a journal the snapshot already absorbed
                        continue
                    doc["meta"].update(line.get("meta", {}))
                    for record in line.get("machines", []):
                        doc["machines"][record["id"]] = record
                    for row in line.get("fences", []):
                        fences[(row[0], row[1])] = row
            doc["fences"] = list(fences.values())
        return doc

    def save(self, doc: Document) -> None:
        """Write a full snapshot atomically and start an empty journal."""
        self.close()
        self._generation += 1
        body = dict(doc, generation=self._generation)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            json.dump(body, fh, separators=(",", ":"))
            fh.flush()
            if self._fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._journal = self.journal_path.open("w", encoding="utf-8")
        self._write({"generation": self._generation})
        self._lines = 0

    def append(self, delta: Document) -> None:
        """Journal one change; it is in the operating system's hands on return."""
        if self._journal is None:
            self._journal = self.journal_path.open("a", encoding="utf-8")
        self._write(delta)
        self._lines += 1

    def _write(self, obj: Document) -> None:
        assert self._journal is not None
        self._journal.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._journal.flush()
        if self._fsync:
            os.fsync(self._journal.fileno())

    def close(self) -> None:
        """Close the journal file (the next append reopens it)."""
        if self._journal is not None:
            self._journal.close()
            self._journal = None


__all__ = ["Document", "StateStore"]
