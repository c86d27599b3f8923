"""image datasets: a dataset's kind, validation status and error, and its image summary

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 04:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing rows are .npz datasets, ready since their upload.
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(
            sa.Column(
                "kind",
                sa.Enum("arrays", "images", name="dataset_kind", native_enum=False, length=16),
                server_default="arrays",
                nullable=False,
            )
        )
        batch.add_column(
            sa.Column(
                "status",
                sa.Enum("pending", "ready", "invalid", name="dataset_status", native_enum=False, length=16),
                server_default="ready",
                nullable=False,
            )
        )
        batch.add_column(sa.Column("error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("images", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("images")
        batch.drop_column("error")
        batch.drop_column("status")
        batch.drop_column("kind")
