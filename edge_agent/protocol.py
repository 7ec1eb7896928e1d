"""Placeholder: filled in by the Edge work."""
