"""Dashboard routes at /ui (placeholder: the Demo/dashboard work fills it in)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
