"""Shards with leases and epochs, cluster and machine assignments, the assignment log.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shards",
        sa.Column("id", sa.String(128), primary_key=True),
        # Incremented by compare-and-set every time a process takes the lease;
        # it is the fencing epoch every provider mutation carries.
        sa.Column("epoch", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("lease_holder", sa.String(256)),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True)),
        sa.Column("address", sa.String(256)),
        sa.Column("state", sa.String(32), nullable=False, server_default="active"),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("epoch >= 0", name="shards_epoch_nonnegative"),
        sa.CheckConstraint("state IN ('active', 'draining', 'removed')", name="shards_state_known"),
    )
    op.create_table(
        "clusters",
        sa.Column("id", sa.String(253), primary_key=True),
        sa.Column("shard_id", sa.String(128), sa.ForeignKey("shards.id"), nullable=False),
        sa.Column(
            "first_seen_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
    )
    op.create_index("clusters_by_shard", "clusters", ["shard_id"])
    op.create_table(
        "machines",
        sa.Column("id", sa.String(253), primary_key=True),
        sa.Column("shard_id", sa.String(128), sa.ForeignKey("shards.id"), nullable=False),
        sa.Column("provider", sa.String(128), nullable=False),
        sa.Column("cluster_id", sa.String(253)),
        sa.Column("operation_seq", sa.BigInteger, nullable=False, server_default="0"),
        # Optimistic-concurrency column: every update is WHERE version = :seen.
        sa.Column("version", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column(
            "shard_metadata",
            postgresql.JSONB,
            nullable=False,
            server_default=sa.text("'{}'::jsonb"),
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_index("machines_by_shard", "machines", ["shard_id"])
    op.create_index("machines_by_cluster", "machines", ["cluster_id"])
    op.create_table(
        "assignment_log",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("machine_id", sa.String(253), nullable=False),
        sa.Column("shard_id", sa.String(128), nullable=False),
        sa.Column("shard_epoch", sa.BigInteger, nullable=False),
        sa.Column("cluster_id", sa.String(253)),
        sa.Column("operation", sa.String(32), nullable=False),
        sa.Column("operation_seq", sa.BigInteger, nullable=False),
        sa.Column("detail", sa.Text),
    )
    op.create_index("assignment_log_by_machine", "assignment_log", ["machine_id", "id"])
    op.create_table(
        "coordinator",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("term", sa.BigInteger, nullable=False, server_default="0"),
        sa.CheckConstraint("id = 1", name="coordinator_singleton"),
    )


def downgrade() -> None:
    op.drop_table("coordinator")
    op.drop_index("assignment_log_by_machine", table_name="assignment_log")
    op.drop_table("assignment_log")
    op.drop_index("machines_by_cluster", table_name="machines")
    op.drop_index("machines_by_shard", table_name="machines")
    op.drop_table("machines")
    op.drop_index("clusters_by_shard", table_name="clusters")
    op.drop_table("clusters")
    op.drop_table("shards")
