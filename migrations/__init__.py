"""Alembic migrations for BigFleet's PostgreSQL schema (see README.md here)."""
