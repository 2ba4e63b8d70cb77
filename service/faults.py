"""Test-only fault injection: die with SIGKILL at a named commit point.

Off unless ``PAYAUTH_FAULT_POINT`` names a point; the crash tests use it to prove that a
kill between any two steps of the commit order loses nothing and debits nothing twice.
"""

from __future__ import annotations

import os
import signal
import sys


class FaultInjector:
    def __init__(self, point: str) -> None:
        self._point = point
        self._fired: set[str] = set()

    def once(self, point: str) -> bool:
        """True the first time ``point`` is reached when it is the configured fault."""
        if self._point == point and point not in self._fired:
            self._fired.add(point)
            return True
        return False

    def armed(self, point: str) -> bool:
        """True while ``point`` is the configured fault and has not fired yet."""
        return self._point == point and point not in self._fired

    def reach(self, point: str) -> None:
        if self._point and point == self._point:
            sys.stderr.write(f'{{"event": "fault_injected", "point": "{point}"}}\n')
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
