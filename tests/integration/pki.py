"""A throw-away certificate authority for the mutual-TLS tests.

Issues real certificates with :mod:`bigfleet.certs` into a temporary
directory and hands out :class:`bigfleet.config.TLSFiles` for them, including
the broken kinds the tests need (expired, no identity, two identities,
another CA).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence
from pathlib import Path

from bigfleet.certs import Authority
from bigfleet.config import TLSFiles
from bigfleet.identity import ChannelSecurity, Identity, KeyPairSource

_counter = itertools.count()


class Pki:
    """One CA and the leaves issued from it, as files under ``root``."""

    def __init__(self, root: Path, *, name: str = "test CA") -> None:
        self.root = root
        self.ca = Authority.create(name)
        self.ca_path = root / f"ca-{next(_counter)}.pem"
        self.ca_path.write_bytes(self.ca.cert_pem)

    def files(
        self,
        identity: Identity | None,
        *,
        extra_uris: Sequence[str] = (),
        expired: bool = False,
        stem: str | None = None,
    ) -> TLSFiles:
        """Issue a leaf and write it (``stem`` names the files, so a rewrite rotates them)."""
        now = dt.datetime.now(dt.UTC)
        leaf = self.ca.issue(
            identity,
            extra_uris=extra_uris,
            not_before=now - dt.timedelta(days=2) if expired else None,
            not_after=now - dt.timedelta(days=1) if expired else None,
        )
        stem = stem or f"leaf-{next(_counter)}"
        cert, key = self.root / f"{stem}.pem", self.root / f"{stem}.key"
        leaf.write(cert, key)
        return TLSFiles(cert=cert, key=key, ca=self.ca_path)

    def source(
        self,
        identity: Identity | None,
        *,
        extra_uris: Sequence[str] = (),
        expired: bool = False,
        stem: str | None = None,
    ) -> KeyPairSource:
        """The files of a new leaf, watched with no delay (tests rotate at once)."""
        files = self.files(identity, extra_uris=extra_uris, expired=expired, stem=stem)
        return KeyPairSource(files, check_every_s=0.0)

    def client(
        self, identity: Identity | None, *, extra_uris: Sequence[str] = (), expired: bool = False
    ) -> ChannelSecurity:
        return ChannelSecurity(self.source(identity, extra_uris=extra_uris, expired=expired))


__all__ = ["Pki"]
