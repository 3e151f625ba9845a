"""Safe adoption: durable pause and dry run per shard, and the decision log.

``shard_controls`` holds one row per shard an operator paused or put in dry
run, plus the row ``*`` for the whole fleet; no row means active. It lives
here, not in a process, so a pause survives restarts and lease takeovers.

``decision_log`` is append-only and bounded: each shard prunes its own rows
past the retention age and past its row cap (``bigfleet.store.decisions``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shard_controls",
        # A shard id, or '*' for every shard.
        sa.Column("shard_id", sa.Text, primary_key=True),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("dry_run", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.Column("changed_by", sa.Text, nullable=False, server_default=""),
        sa.Column(
            "changed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("version", sa.BigInteger, nullable=False, server_default="1"),
        # Set by the shard process itself at start (BIGFLEET_MODE), for `bigfleet shards`.
        sa.Column("shadow", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_table(
        "decision_log",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("shard_id", sa.Text, nullable=False),
        # The engine's `now` for the cycle that decided (not the insert time).
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cycle", sa.BigInteger, nullable=False),
        # active | shadow | dry-run | paused: whether anything was carried out.
        sa.Column("mode", sa.Text, nullable=False),
        # provision, assign, preempt, reclaim, release, verify, held, unmet
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("machine_id", sa.Text, nullable=False, server_default=""),
        sa.Column("cluster_id", sa.Text, nullable=False, server_default=""),
        sa.Column("need_key", sa.Text, nullable=False, server_default=""),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        # The inputs that decided it (shape, price, priorities, budget and use, ...).
        sa.Column("inputs", postgresql.JSONB, nullable=False, server_default="{}"),
    )
    op.create_index("decision_log_machine", "decision_log", ["machine_id", "decided_at"])
    op.create_index("decision_log_need", "decision_log", ["cluster_id", "need_key", "decided_at"])
    op.create_index("decision_log_shard_id", "decision_log", ["shard_id", "id"])


def downgrade() -> None:
    op.drop_table("decision_log")
    op.drop_table("shard_controls")
