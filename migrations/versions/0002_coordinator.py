"""Coordinator instructions with their outcomes; shard drain/removal bookkeeping.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "coordinator_instructions",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        # (term, seq) fences the instruction: shards refuse a term lower than
        # the highest they have seen.
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("donor_shard", sa.String(128)),
        sa.Column("receiver_shard", sa.String(128)),
        sa.Column(
            "payload", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")
        ),
        sa.Column("status", sa.String(16), nullable=False, server_default="pending"),
        sa.Column("outcome", sa.Text),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.UniqueConstraint("term", "seq", name="coordinator_instructions_term_seq"),
        sa.CheckConstraint(
            "status IN ('pending', 'applied', 'refused', 'failed')",
            name="coordinator_instructions_status_known",
        ),
    )
    op.create_index(
        "coordinator_instructions_by_status", "coordinator_instructions", ["status", "id"]
    )
    op.add_column(
        "machines", sa.Column("assigned_term", sa.BigInteger, nullable=False, server_default="0")
    )


def downgrade() -> None:
    op.drop_column("machines", "assigned_term")
    op.drop_index("coordinator_instructions_by_status", table_name="coordinator_instructions")
    op.drop_table("coordinator_instructions")
