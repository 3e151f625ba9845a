"""Options several command groups share, declared once so their names and help agree."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["AddressOption", "DatabaseOption", "NamespaceOption", "VerboseOption"]

DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="PostgreSQL URL (default: $BIGFLEET_DATABASE_URL, else the running dev stack's).",
    ),
]
AddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Temporal frontend host:port (default: $BIGFLEET_TEMPORAL_ADDRESS, "
        "else the running dev stack's).",
    ),
]
NamespaceOption = Annotated[str, typer.Option("--namespace", help="Temporal namespace.")]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v")]
