"""engine routing: the workers registry; where a job's TensorRT engine stage ran and how it ended

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-22 04:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _engine_columns() -> list[sa.Column]:
    return [
        sa.Column("engine_status", sa.String(length=16), nullable=True),
        sa.Column("engine_reason", sa.Text(), nullable=True),
        sa.Column("engine_worker", sa.String(length=255), nullable=True),
        sa.Column("engine_gpu", sa.String(length=255), nullable=True),
        sa.Column("engine_tensorrt_version", sa.String(length=64), nullable=True),
        sa.Column("engine_request", sa.Uuid(), nullable=True),
    ]


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("engine_capable", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("gpu_name", sa.String(length=255), nullable=True),
        sa.Column("compute_capability", sa.String(length=16), nullable=True),
        sa.Column("tensorrt_version", sa.String(length=64), nullable=True),
        sa.Column("capabilities", sa.JSON(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_workers_heartbeat_at"), ["heartbeat_at"], unique=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for column in _engine_columns():
            batch_op.add_column(column)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for column in reversed(_engine_columns()):
            batch_op.drop_column(column.name)
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_workers_heartbeat_at"))
    op.drop_table("workers")
