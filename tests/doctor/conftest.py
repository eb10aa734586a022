"""Shared helpers for the doctor tests: the fixture trees, and the GPU skip."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def cuda_available() -> bool:
    """True when torch sees a CUDA device (False when torch is absent)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def needs_gpu():
    """Skip (never fake) when no CUDA device exists."""
    if not cuda_available():
        pytest.skip("no CUDA device")
