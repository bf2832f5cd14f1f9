"""Durable state: SQLAlchemy models, the engine factory and the repository functions."""
