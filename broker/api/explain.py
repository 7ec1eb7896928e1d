"""Explain/what-if API routes (placeholder: the Placement work fills it in)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
