"""Why a profile's batch is below the spec's bound, kept with the profile.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("profiles", sa.Column("batch_note", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("profiles", "batch_note")
