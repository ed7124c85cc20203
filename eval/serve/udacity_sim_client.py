"""A client that talks to a Udacity server the way the old Unity simulator does, for tests and transcripts.

The simulator (its SocketIOComponent.cs) opens a raw websocket to
``/socket.io/?EIO=4&transport=websocket`` with no polling handshake, never sends the Socket.IO
namespace CONNECT packet "40", sends Engine.IO pings ("2") itself and expects pongs ("3"),
answers server pings, and writes events as ``42["telemetry",{...}]`` text frames. A modern
Socket.IO client behaves differently, which is exactly why testing a server only with one proves
nothing about the simulator (see :mod:`nsacdrive.eval.serve.udacity_server`).
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

#: Engine.IO v3 packet types, as single characters on the wire.
OPEN, PING, PONG, MESSAGE = "0", "2", "3", "4"
#: Socket.IO packet types inside an Engine.IO MESSAGE.
SIO_CONNECT, SIO_EVENT = "0", "2"


def abbreviate(frame: str, limit: int = 160) -> str:
    """A wire frame shortened for a transcript (base64 images run to tens of kilobytes)."""
    return frame if len(frame) <= limit else f"{frame[:limit]}… ({len(frame)} chars)"


class SimulatorClient:
    """Speaks the simulator's dialect over a raw websocket (``websocket-client``).

    Every frame sent and received is appended to :attr:`transcript` as ``-> frame`` / ``<- frame``.
    """

    def __init__(self, url: str = "ws://127.0.0.1:4567", timeout: float = 10.0) -> None:
        import websocket

        self.transcript: list[str] = []
        self.events: deque[tuple[str, Any]] = deque()
        self.ws = websocket.create_connection(f"{url.rstrip('/')}/socket.io/?EIO=4&transport=websocket", timeout=timeout)
        opening = self._recv()
        if not opening.startswith(OPEN):
            raise ConnectionError(f"expected an Engine.IO OPEN packet first, got {abbreviate(opening)!r}")
        self.handshake: dict[str, Any] = json.loads(opening[1:])

    def _send(self, frame: str) -> None:
        self.transcript.append(f"-> {abbreviate(frame)}")
        self.ws.send(frame)

    def _recv(self) -> str:
        frame = self.ws.recv()
        self.transcript.append(f"<- {abbreviate(frame)}")
        return frame

    def _read_one(self) -> str:
        """Read one frame: answer a server ping, queue an event, return the frame."""
        frame = self._recv()
        if frame == PING:
            self._send(PONG)
        elif frame.startswith(MESSAGE + SIO_EVENT):
            event, *data = json.loads(frame[2:])
            self.events.append((event, data[0] if data else None))
        return frame

    def ping(self) -> None:
        """Send an Engine.IO ping as the simulator does, and wait for the pong (events meanwhile are kept)."""
        self._send(PING)
        while self._read_one() != PONG:
            pass

    def emit(self, event: str, data: Any = None) -> None:
        """Send ``42["event",data]`` (``42["event"]`` without data)."""
        self.send_raw(MESSAGE + SIO_EVENT + json.dumps([event] if data is None else [event, data]))

    def send_raw(self, frame: str) -> None:
        """Send any text frame as it is (for malformed messages)."""
        self._send(frame)

    def receive(self) -> tuple[str, Any]:
        """The next event from the server as (name, data)."""
        while not self.events:
            self._read_one()
        return self.events.popleft()

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> SimulatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
