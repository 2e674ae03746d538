"""A TCP proxy on loopback that stands in for a bad network between a client and a real server.

``cut_after(n)`` makes the next connection drop after `n` bytes of the server's answer (an
interrupted download); ``rate`` slows every answer to that many bytes per second (a slow link).
Everything else passes through untouched, so the server on the far side is the real one.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Iterator

from hotset_testing.processes import free_port


class CuttingProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.rate: float | None = None  # bytes per second of the server's answers; None: full speed
        self._cut_after: int | None = None
        self.cuts = 0
        self.answered = 0  # bytes of answers passed on, every connection together
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut_after(self, nbytes: int) -> None:
        self._cut_after = nbytes

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: bool) -> None:
        sent = 0
        cut = self._cut_after if answer else None
        if answer and cut is not None:
            self._cut_after = None
        try:
            while chunk := await reader.read(64 * 1024):
                if cut is not None and sent + len(chunk) >= cut:
                    writer.write(chunk[: max(0, cut - sent)])
                    await writer.drain()
                    self.cuts += 1
                    writer.transport.abort()
                    return
                if answer and self.rate:
                    await asyncio.sleep(len(chunk) / self.rate)
                writer.write(chunk)
                await writer.drain()
                sent += len(chunk)
                if answer:
                    self.answered += len(chunk)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(self._pipe(client_reader, server_writer, answer=False),
                             self._pipe(server_reader, client_writer, answer=True))

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        started.set()
        self._loop.run_forever()

    @contextlib.contextmanager
    def running(self) -> Iterator["CuttingProxy"]:
        started = threading.Event()
        thread = threading.Thread(target=self._run, args=(started,), name="cutting-proxy", daemon=True)
        thread.start()
        started.wait(10)
        try:
            yield self
        finally:
            def stop() -> None:
                assert self._server is not None
                self._server.close()
                for task in asyncio.all_tasks(self._loop):
                    task.cancel()
                self._loop.stop()

            self._loop.call_soon_threadsafe(stop)
            thread.join(10)
