"""Start llama.cpp ``rpc-server`` processes on this machine, for testing ``--rpc``.

    python scripts/rpc_servers.py --build               # build rpc-server once (minutes)
    python scripts/rpc_servers.py                        # 2 servers; prints the --rpc value
    python scripts/rpc_servers.py --delay-ms 5           # ... each behind a proxy adding 5 ms RTT

then, in another terminal, ``edgespec chat --rpc 127.0.0.1:50052,127.0.0.1:50053``.
Ctrl-C stops them. The servers are built from the llama.cpp that llama-cpp-python
vendors (see ``llamacpp_reference.py``), so client and servers speak the same
RPC protocol.

``--delay-ms`` puts a TCP proxy in front of each server that holds every chunk
for half the delay in each direction, so each request/response round trip takes
that much longer, as on a network (a stand-in for ``tc netem``, which needs
root). The proxy runs in a process of its own, so its Python does not compete
with edgespec's. Tests and benchmarks use :class:`LocalRpcServers`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgespec.backends.rpc import greet  # noqa: E402
from edgespec.errors import EdgespecError  # noqa: E402


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: all held at once while chosen (one at a time,
    the OS may hand out again a port chosen for a process that has not bound it yet)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class LocalRpcServers:
    """``count`` rpc-servers on 127.0.0.1 (each behind a delaying proxy if
    ``delay_ms`` is given, 0 included); ``endpoints`` is what ``--rpc`` takes."""

    def __init__(self, binary: Path, count: int = 2, *, threads: int | None = None,
                 delay_ms: float | None = None, ports: list[int] | None = None,
                 ignore_sigpipe: bool = True):
        self.binary, self.count, self.delay_ms = binary, count, delay_ms
        self.ignore_sigpipe = ignore_sigpipe
        self.threads = threads or os.cpu_count() or 1
        # The servers' ports and their proxies', chosen together so they differ.
        n = len(ports) if ports else count
        chosen = free_ports(2 * n)
        self.ports = ports or chosen[:n]
        self.proxy_ports = [p for p in chosen if p not in self.ports][:n]
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.endpoints: list[str] = []

    def __enter__(self) -> "LocalRpcServers":
        try:
            for port, listen in zip(self.ports, self.proxy_ports):
                log = Path(os.environ.get("TMPDIR", "/tmp")) / f"edgespec-rpc-server-{port}.log"
                self.logs.append(log)
                with open(log, "w") as out:
                    self.processes.append(subprocess.Popen(
                        [str(self.binary), "--host", "127.0.0.1", "--port", str(port),
                         "--threads", str(self.threads)],
                        stdout=out, stderr=subprocess.STDOUT,
                        # SIGPIPE stays ignored (as in Python): rpc-server dies of it when a
                        # client leaves in the middle of a request (Ctrl-C, a timed-out greeting).
                        restore_signals=not self.ignore_sigpipe))
                endpoint = f"127.0.0.1:{port}"
                if self.delay_ms is not None:
                    self.processes.append(subprocess.Popen(
                        [sys.executable, __file__, "proxy", "--listen", str(listen),
                         "--to", endpoint, "--delay-ms", str(self.delay_ms)]))
                    endpoint = f"127.0.0.1:{listen}"
                self.endpoints.append(endpoint)
            for endpoint in self.endpoints:
                self._wait_ready(endpoint)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self, endpoint: str, timeout: float = 30.0) -> None:
        """Until the server answers HELLO (through its proxy, if any)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                greet(endpoint, timeout=5.0)
                return
            except EdgespecError:
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                    logs = "\n".join(log.read_text()[-500:] for log in self.logs if log.exists())
                    raise RuntimeError(f"rpc-server at {endpoint} did not start:\n{logs}") from None
                time.sleep(0.05)  # polling for readiness, not waiting for an outcome

    def served(self) -> list[bool]:
        """Whether each server has served a client (its log says so)."""
        return ["Accepted client connection" in log.read_text() for log in self.logs]

    def resident_bytes(self) -> list[int]:
        """Each server's resident memory (Linux): the weights it holds show here."""
        servers = [p for p in self.processes if p.args[0] == str(self.binary)]
        sizes = []
        for process in servers:
            status = Path(f"/proc/{process.pid}/status").read_text()
            line = next(x for x in status.splitlines() if x.startswith("VmRSS:"))
            sizes.append(int(line.split()[1]) * 1024)
        return sizes

    def __exit__(self, *exc) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


# -- the delaying proxy ------------------------------------------------------------------


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Forward bytes, each chunk released ``delay`` seconds after it arrived (in order)."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=64)  # backpressure: at most 64 MiB held

    async def release() -> None:
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.ensure_future(release())
    try:
        while data := await reader.read(1 << 20):
            await queue.put((time.monotonic() + delay, data))
    except ConnectionError:
        pass
    await queue.put((0.0, None))
    with contextlib.suppress(ConnectionError):
        await sender


async def _proxy(listen: int, to: str, delay_ms: float) -> None:
    host, _, port = to.rpartition(":")
    one_way = delay_ms / 2000.0

    async def handle(client_reader, client_writer):
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
        for writer in (client_writer, server_writer):  # small RPC messages: no Nagle delays
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pump(client_reader, server_writer, one_way),
                             _pump(server_reader, client_writer, one_way))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    proxy = sub.add_parser("proxy", help="(internal) a delaying TCP proxy")
    proxy.add_argument("--listen", type=int, required=True)
    proxy.add_argument("--to", required=True)
    proxy.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--build", action="store_true", help="build rpc-server (once) and exit")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--port", type=int, default=50052, help="the first server's port")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads per server")
    parser.add_argument("--delay-ms", type=float, default=None,
                        help="round-trip time a proxy in front of each server adds")
    args = parser.parse_args()
    if args.command == "proxy":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        asyncio.run(_proxy(args.listen, args.to, args.delay_ms))
        return 0
    from llamacpp_reference import build_rpc_server
    binary = build_rpc_server()
    if args.build:
        print(binary)
        return 0
    for stop in (signal.SIGINT, signal.SIGTERM):  # (SIGINT is ignored in a background job)
        signal.signal(stop, signal.default_int_handler)
    ports = [args.port + i for i in range(args.servers)]
    with LocalRpcServers(binary, args.servers, threads=args.threads, delay_ms=args.delay_ms,
                         ports=ports) as servers:
        print(f"--rpc {','.join(servers.endpoints)}   (Ctrl-C stops the servers)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
