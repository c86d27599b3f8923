"""validation re-sends: attempts and last send time on models and datasets

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 05:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("models", "datasets"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("validation_attempts", sa.Integer(), server_default="1", nullable=False))
            batch_op.add_column(sa.Column("validation_sent_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for table in ("datasets", "models"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("validation_sent_at")
            batch_op.drop_column("validation_attempts")
