"""Failed logins, throttled per user name and per client address.

A name or an address with ``limit`` failures inside ``window_s`` is refused (429, with
``Retry-After``) until the oldest of those failures leaves the window, whatever credentials it
sends: guessing a password costs time, not just requests. A success does not clear the count
(a guesser holding one good password must not reset another user's). Memory stays bounded:
at most ``MAX_KEYS`` names and addresses are tracked, the stalest forgotten first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque

__all__ = ["ADDRESS_LIMIT", "USER_LIMIT", "WINDOW_S", "LoginThrottle"]

USER_LIMIT = 10
ADDRESS_LIMIT = 30
WINDOW_S = 300
MAX_KEYS = 10_000


class LoginThrottle:
    """Counts failed logins per user name and per client address in a sliding window."""

    def __init__(self, user_limit: int = USER_LIMIT, address_limit: int = ADDRESS_LIMIT,
                 window_s: float = WINDOW_S) -> None:
        self._limits = {"user": user_limit, "address": address_limit}
        self.window_s = window_s
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._lock = threading.Lock()  # requests are served by several threads

    def __repr__(self) -> str:
        return f"LoginThrottle({self._limits['user']}/user, {self._limits['address']}/address)"

    def retry_after(self, user: str | None, address: str | None, now_s: float) -> int:
        """Seconds until a login of ``user`` from ``address`` may be tried again (0: now)."""
        with self._lock:
            return max([0, *(self._wait(key, now_s) for key in _keys(user, address))])

    def failed(self, user: str | None, address: str | None, now_s: float) -> None:
        """Record one failed login of ``user`` from ``address``."""
        with self._lock:
            for key in _keys(user, address):
                times = self._failures.pop(key, None) or deque()
                times.append(now_s)
                while len(times) > self._limits[key[0]]:
                    times.popleft()
                self._failures[key] = times
            while len(self._failures) > MAX_KEYS:
                self._failures.popitem(last=False)

    def _wait(self, key: tuple[str, str], now_s: float) -> int:
        times = self._failures.get(key)
        if times is None:
            return 0
        while times and times[0] <= now_s - self.window_s:
            times.popleft()
        if len(times) < self._limits[key[0]]:
            return 0
        return max(1, int(times[0] + self.window_s - now_s) + 1)


def _keys(user: str | None, address: str | None) -> list[tuple[str, str]]:
    keys = [] if user is None else [("user", user)]
    return keys + ([] if address is None else [("address", address)])
