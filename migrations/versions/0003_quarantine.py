"""Quarantined machines survive a shard restart.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: in use. Otherwise why the owning shard stopped using the machine
    # (a bad slot, or an operator's abandon for investigation).
    op.add_column("machines", sa.Column("quarantined_reason", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("machines", "quarantined_reason")
