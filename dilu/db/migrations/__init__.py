"""Alembic migrations: the only way Dilu's schema is created or changed."""
