"""A webhook receiver for tests: a loopback HTTP server that records every POST and answers from a script."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int


@dataclass
class Receiver:
    answers: list[int] = field(default_factory=list)  # answered in order; 200 once they run out
    refuse: dict[str, int] = field(default_factory=dict)  # webhook-id -> how many times to answer 500 first
    received: list[Received] = field(default_factory=list)
    location: str | None = None  # sent with a 3xx answer

    def __post_init__(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver._lock:
                    status = receiver._answer(headers.get("webhook-id", ""))
                    receiver.received.append(Received(headers, body, status))
                self.send_response(status)
                if 300 <= status < 400 and receiver.location:
                    self.send_header("location", receiver.location)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _answer(self, msg_id: str) -> int:
        if self.refuse.get(msg_id):
            self.refuse[msg_id] -= 1
            return 500
        return self.answers.pop(0) if self.answers else 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def acknowledged(self) -> list[Received]:
        return [r for r in self.received if 200 <= r.answered < 300]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
