"""Placeholder: filled in by the Placement work."""
