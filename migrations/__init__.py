"""Alembic environment and versions (the schema's history).

Shipped in the wheel so `skyfed db upgrade` works from an installed package.
"""
