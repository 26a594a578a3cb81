"""A TCP proxy that loses one reply: the request reaches the server (the write is applied) and
its answer never reaches the client, which times out (a reply lost on the network)."""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field

from tests.reliability.cluster import free_port


@dataclass
class ReplyLosingProxy:
    """Forwards 127.0.0.1:``port`` to 127.0.0.1:``target``; once ``lose_reply_to(marker)`` is
    armed, the first request whose bytes hold ``marker`` is forwarded and its connection's
    replies are dropped from then on (the client gives up at its socket timeout)."""

    target: int
    port: int = field(default_factory=free_port)
    lost: list[bytes] = field(default_factory=list)
    _marker: bytes | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _server: socket.socket | None = None

    def start(self) -> ReplyLosingProxy:
        """Listen and forward in background threads."""
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def lose_reply_to(self, marker: bytes) -> None:
        """Lose the reply of the next request holding ``marker``."""
        with self._lock:
            self._marker = marker

    def close(self) -> None:
        """Stop listening (open connections end with their peers)."""
        self._closing.set()
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.close()

    def _accept(self) -> None:
        assert self._server is not None
        while not self._closing.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            muted = threading.Event()
            threading.Thread(target=self._requests, args=(client, upstream, muted),
                             daemon=True).start()
            threading.Thread(target=self._replies, args=(upstream, client, muted),
                             daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket,
                  muted: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:  # muted before the request leaves: its reply never passes
                    if self._marker is not None and self._marker in data:
                        self.lost.append(self._marker)
                        self._marker = None
                        muted.set()
                upstream.sendall(data)
        _close(client, upstream)

    @staticmethod
    def _replies(upstream: socket.socket, client: socket.socket, muted: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if not muted.is_set():
                    client.sendall(data)
        _close(client, upstream)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.close()
