"""``payauth purge``: the retention of the dedup store (``service/adapters/retention.py``) run
once, on a connection of its own."""

from __future__ import annotations

from service.adapters.retention import purge_once
from service.config import Settings


async def purge_command(settings: Settings, *, batch_size: int, pause_seconds: float) -> int:
    """Remove the dedup records older than the retention window (whole days dropped, the
    rest row by row); return how many went."""
    return await purge_once(settings.database_url.get_secret_value(),
                            retention_hours=settings.dedup_retention_hours,
                            batch_size=batch_size, pause_seconds=pause_seconds)
