"""Code bundles (uploaded function folders, stored by content digest) and a function's bundle.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bundles",
        sa.Column("digest", sa.String(71), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("functions") as batch:
        batch.add_column(sa.Column("bundle", sa.String(71), nullable=True))
        batch.create_foreign_key("fk_functions_bundle", "bundles", ["bundle"], ["digest"])


def downgrade() -> None:
    with op.batch_alter_table("functions") as batch:
        batch.drop_constraint("fk_functions_bundle", type_="foreignkey")
        batch.drop_column("bundle")
    op.drop_table("bundles")
