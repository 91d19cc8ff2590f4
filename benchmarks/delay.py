"""A TCP relay that adds a round trip: each chunk is forwarded half of ``--rtt`` after it
arrived, in both directions, in order. The benchmarks put a store behind it to show
what a slower network does to lateness (``benchmarks.run --suite --parts lookahead``).

    .venv/bin/python -m benchmarks.delay --port 16379 --target 127.0.0.1:6379 --rtt 0.02

It runs in a process of its own, so that its work is not counted in any instance's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

from benchmarks.ports import free_port


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Forward what ``reader`` gives to ``writer``, each chunk ``delay`` s after it came."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    loop = asyncio.get_running_loop()
    try:
        while True:
            data = await reader.read(65536)
            await queue.put((loop.time() + delay, data))
            if not data:
                break
        await sender
    except (ConnectionError, OSError):
        sender.cancel()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(port: int, host: str, target_port: int, rtt: float) -> None:
    async def link(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            up_reader, up_writer = await asyncio.open_connection(host, target_port)
        except OSError:
            writer.close()
            return
        up_sock = up_writer.get_extra_info("socket")
        if up_sock is not None:
            up_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pump(reader, up_writer, rtt / 2), _pump(up_reader, writer, rtt / 2))

    server = await asyncio.start_server(link, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def relay(target: str, rtt: float) -> Iterator[int]:
    """A relay process to ``target`` (``host:port``) adding ``rtt`` seconds; its port."""
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.delay", "--port", str(port)]
    argv += ["--target", target, "--rtt", str(rtt)]
    proc = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the delaying relay did not start") from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--target", required=True, help="host:port")
    parser.add_argument("--rtt", type=float, required=True, help="seconds added per round trip")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, host, int(port), args.rtt))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
