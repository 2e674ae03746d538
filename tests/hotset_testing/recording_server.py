"""An impostor's HTTP server for tests: a stand-in for a pod that would read prompts, forge
answers or report forged queues. It records every request it gets (method, path, Authorization)
and answers 404, or, for the paths in `answers`, a fixed JSON body (an impostor handing out
another pod's identity token), so a test can assert that nothing was sent to it, no token included."""
from __future__ import annotations

import http.server
import json
import threading
from typing import Any


class RecordingServer:
    """An impostor's HTTP server: records every request it gets and answers 404."""

    def __init__(self, host: str, port: int, answers: dict[str, Any] | None = None) -> None:
        self.requests: list[tuple[str, str, str]] = []  # (method, path, Authorization)
        record = self.requests
        bodies = {path: json.dumps(body).encode() for path, body in (answers or {}).items()}

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                record.append((self.command, self.path, self.headers.get("Authorization", "")))
                body = bodies.get(self.path)
                self.send_response(404 if body is None else 200)
                self.send_header("Content-Length", str(len(body or b"")))
                if body is not None:
                    self.send_header("Content-Type", "application/json")
                self.end_headers()
                if body is not None:
                    self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
