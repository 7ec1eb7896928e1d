"""Composition root (placeholder: the Foundation work fills it in)."""
