"""operations: per-project quotas, the stage-duration histogram

Revision ID: 0005
Revises: 0002
Create Date: 2026-11-22 04:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.add_column(sa.Column("max_storage_bytes", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("max_concurrent_jobs", sa.Integer(), nullable=True))
    op.create_table(
        "stage_duration_buckets",
        sa.Column("stage", sa.String(length=32), nullable=False),
        sa.Column("le", sa.Float(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("sum_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("stage", "le"),
    )


def downgrade() -> None:
    op.drop_table("stage_duration_buckets")
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.drop_column("max_concurrent_jobs")
        batch_op.drop_column("max_storage_bytes")
