"""Fixtures for the unit tier (pure logic: no I/O, no services)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def clean_payauth_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``PAYAUTH_*`` variable of the machine running the tests leaks into the settings."""
    for key in list(os.environ):
        if key.startswith("PAYAUTH_"):
            monkeypatch.delenv(key)
