"""Running the stand-in: as a process (``serve``, ``main``) and from synchronous code."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from loadtest.toxiproxy_standin.api import ToxiproxyServer

logger = logging.getLogger(__name__)

LISTENING_PREFIX = "listening on "


async def serve(host: str, port: int) -> None:
    """Run until SIGINT/SIGTERM, printing the ``listening on`` line once accepting."""
    server = ToxiproxyServer()
    await server.start(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Parents (run_in_subprocess, loadtest/wan.py) wait for exactly this line.
    print(f"{LISTENING_PREFIX}{server.url}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        logger.info("shutting down")
        await server.stop()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Toxiproxy stand-in (HTTP API + TCP proxies)")
    parser.add_argument("--host", default="127.0.0.1", help="API address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8474, help="API port; 0 picks a free one")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument("--no-uvloop", action="store_true", help="use the stock asyncio loop")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    factory = None if args.no_uvloop else _loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(args.host, args.port))
    return 0


@contextlib.contextmanager
def run_in_subprocess(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    startup_timeout: float = 15.0,
    log_level: str = "INFO",
) -> Iterator[str]:
    """Run the stand-in as ``python -m loadtest.toxiproxy_standin``; yield its API URL.

    For synchronous callers (pytest fixtures, the demo). The child's stderr is
    forwarded to this process's logging; the child is stopped by PID at exit
    (SIGTERM, then SIGKILL if it does not exit within 5 s).
    """
    cmd = [sys.executable, "-m", "loadtest.toxiproxy_standin", "--host", host]
    cmd += ["--port", str(port), "--log-level", log_level]
    env = dict(os.environ)
    # The child must import `loadtest` even when the project is not installed.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=env,
    ) as proc:  # fmt: skip
        watcher = _StderrWatcher(proc)
        try:
            yield watcher.wait_for_url(startup_timeout)
        finally:
            stop_process(proc)
            watcher.join()


class _StderrWatcher:
    """Reads a child's stderr on a thread: finds ``listening on URL``, forwards the rest."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self._proc = proc
        self._url: str | None = None
        self._ready = threading.Event()
        self._log = logging.getLogger(f"{__name__}.child")
        self._thread = threading.Thread(target=self._drain, name="toxiproxy-stderr", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        assert self._proc.stderr is not None
        # Keep reading after startup too: a full pipe would block the child.
        for line in self._proc.stderr:
            line = line.rstrip("\n")
            if self._url is None and line.startswith(LISTENING_PREFIX):
                self._url = line[len(LISTENING_PREFIX) :].strip()
                self._ready.set()
            else:
                self._log.info("[pid %s] %s", self._proc.pid, line)
        self._ready.set()  # EOF: the child is gone; unblock the waiter

    def wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if time.monotonic() > deadline:
                raise TimeoutError(f"toxiproxy stand-in did not start within {timeout} s")
        if self._url is None:
            raise RuntimeError(f"toxiproxy stand-in exited with code {self._proc.wait()}")
        return self._url

    def join(self) -> None:
        self._thread.join(timeout=5)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """Stop ``proc`` by PID: SIGTERM, then SIGKILL if it has not exited within 5 s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        logger.warning("pid %s ignored SIGTERM; killing it", proc.pid)
        proc.kill()
        proc.wait()
