"""datasets.num_samples nullable: samples may run along each model input's own batch axis

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22 08:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.alter_column("num_samples", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    # Datasets uploaded since whose arrays share no first axis: the old schema needs a number, 0 = not counted.
    op.execute("UPDATE datasets SET num_samples = 0 WHERE num_samples IS NULL")
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.alter_column("num_samples", existing_type=sa.Integer(), nullable=False)
