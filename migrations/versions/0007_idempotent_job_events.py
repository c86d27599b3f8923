"""idempotent job events: a worker's events numbered per attempt, unique per job

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22 08:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("sequence", sa.Integer(), nullable=True))
        batch_op.create_unique_constraint("uq_job_events_attempt_sequence", ["job_id", "attempt", "sequence"])


def downgrade() -> None:
    with op.batch_alter_table("job_events", schema=None) as batch_op:
        batch_op.drop_constraint("uq_job_events_attempt_sequence", type_="unique")
        batch_op.drop_column("sequence")
        batch_op.drop_column("attempt")
