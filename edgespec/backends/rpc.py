"""Model layers on other machines: llama.cpp's RPC backend (``rpc-server``).

llama.cpp spreads a model's layers over the devices it is given; an
``rpc-server`` on another machine is one such device (or several). This
module turns ``HOST:PORT`` endpoints into those devices, through ggml's
backend registry, for :class:`~edgespec.backends.llamacpp.LlamaCppBackend`
to pass as ``llama_model_params.devices``.

Unlike ``llama-cli --rpc`` it does not register the servers globally: only the
model that asks for them (the target) uses them, so a draft model loaded in the
same process stays on this machine.

ggml aborts the whole process when a server cannot be reached or speaks
another protocol version, and waits forever for a busy one (a server serves one
client at a time), so each endpoint is first greeted here, in Python (the same
HELLO a client sends first), and each of those is a clear error instead.
"""

from __future__ import annotations

import ctypes
import functools
import re
import socket
import struct
from collections import Counter
from pathlib import Path
from typing import Sequence

from ..errors import EdgespecError


_HELLO = 14            # RPC_CMD_HELLO: always 14, in every protocol version
_CAPS = 24             # RPC_CONN_CAPS_SIZE: transport capabilities (zeros: plain TCP)
_HELLO_REPLY = 4 + _CAPS  # rpc_msg_hello_rsp: major, minor, patch, padding, caps
_GPU, _IGPU = 1, 2     # GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU: what llama.cpp offloads to by default


def install_line() -> str:
    """How to rebuild this llama-cpp-python with RPC on (other CMAKE_ARGS, such as
    -DGGML_CUDA=on, go in the same quotes)."""
    try:
        import llama_cpp
        pin = f"=={llama_cpp.__version__}"
    except ImportError:
        pin = ""
    return (f'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir --no-deps '
            f'llama-cpp-python{pin}')


def parse_endpoints(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"HOST:PORT,HOST:PORT"`` (or a list of them) as a tuple, checked."""
    if not text:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    endpoints = []
    for item in (i.strip() for i in items):
        host, sep, port = item.rpartition(":")
        # ggml splits at the first colon and resolves IPv4 names only.
        if not sep or not host or ":" in host or not port.isdigit() or not 0 < int(port) < 65536:
            raise EdgespecError(
                f"invalid RPC server {item!r}: give HOST:PORT, e.g. 192.168.1.20:50052 "
                f"(comma-separated for several)")
        endpoints.append(item)
    return tuple(endpoints)


def rpc_available() -> bool:
    """Whether this llama-cpp-python was built with llama.cpp's RPC backend."""
    try:
        import llama_cpp
    except ImportError:
        return False
    return bool(llama_cpp.llama_supports_rpc())


def protocol_version() -> tuple[int, int] | None:
    """The RPC protocol (major, minor) this build speaks, from the header installed with it."""
    try:
        import llama_cpp
    except ImportError:
        return None
    header = Path(llama_cpp.__file__).parent.parent / "include" / "ggml-rpc.h"
    text = header.read_text() if header.exists() else ""
    found = [re.search(rf"RPC_PROTO_{part}_VERSION\s+(\d+)", text) for part in ("MAJOR", "MINOR")]
    return (int(found[0].group(1)), int(found[1].group(1))) if all(found) else None


class _Closed(Exception):
    """The server hung up in the middle of the greeting."""


def greet(endpoint: str, *, timeout: float = 10.0) -> tuple[int, int, int]:
    """Say HELLO to an ``rpc-server`` and return its protocol version; a clear
    error if it cannot be reached, is busy, is not an rpc-server, or speaks a
    protocol this build would abort on."""
    host, _, port = endpoint.rpartition(":")
    start = (f"start it there with `rpc-server --host 0.0.0.0 --port {port}` "
             f"(docs/rpc.md)")
    rebuild = "run an rpc-server built from the llama.cpp that llama-cpp-python vendors " \
              "(`python scripts/rpc_servers.py --build`)"
    try:
        # IPv4, as ggml resolves it (gethostbyname), so this reaches the same address.
        address = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)[0][4]
        sock = socket.create_connection(address, timeout=timeout)
    except socket.timeout:
        raise EdgespecError(f"cannot reach rpc-server at {endpoint} (no answer to connect within "
                            f"{timeout:g} s): check the address and the network") from None
    except OSError as exc:
        raise EdgespecError(f"cannot reach rpc-server at {endpoint} ({exc.strerror or exc}): {start}") from None
    with sock:
        try:
            sock.sendall(bytes([_HELLO]) + struct.pack("<Q", _CAPS) + bytes(_CAPS))
            (size,) = struct.unpack("<Q", _receive(sock, 8))
            if size != _HELLO_REPLY:
                raise EdgespecError(f"{endpoint} answered, but not as this version's rpc-server does "
                                    f"(a {size}-byte greeting): check the port, or {rebuild}")
            major, minor, patch = _receive(sock, size)[:3]
        except socket.timeout:
            # Leave with a reset, not a close: the server answers this greeting once it is
            # free, and answering a closed connection kills it (SIGPIPE); a reset one it skips.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            raise EdgespecError(
                f"rpc-server at {endpoint} did not answer within {timeout:g} s: it serves one "
                f"client at a time, so another program may be using it; stop that or start "
                f"another server ({start})") from None
        except _Closed:
            raise EdgespecError(f"{endpoint} hung up on the greeting: probably an rpc-server of "
                                f"another protocol version; {rebuild}") from None
        except OSError as exc:
            raise EdgespecError(f"lost rpc-server at {endpoint} ({exc.strerror or exc}): {start}") from None
    ours = protocol_version()
    # ggml's client aborts unless the major versions match and the server's minor is not newer.
    if ours is not None and (major != ours[0] or minor > ours[1]):
        raise EdgespecError(
            f"rpc-server at {endpoint} speaks RPC protocol {major}.{minor}.{patch}, this "
            f"llama-cpp-python speaks {ours[0]}.{ours[1]}: {rebuild}")
    return major, minor, patch


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise _Closed
        data += chunk
    return data


@functools.cache
def ggml_functions() -> "_Ggml":
    """ggml's backend-registry functions, bound once (RPC, repacking, ``edgespec info``)."""
    return _Ggml()


class _Ggml:
    """The few ggml backend-registry functions edgespec needs, through ctypes."""

    def __init__(self):
        from llama_cpp._ggml import libggml
        p, s, c = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        for name, restype, argtypes in (
                ("ggml_backend_reg_by_name", p, [c]),
                ("ggml_backend_reg_get_proc_address", p, [p, c]),
                ("ggml_backend_reg_dev_count", s, [p]),
                ("ggml_backend_reg_dev_get", p, [p, s]),
                ("ggml_backend_dev_count", s, []),
                ("ggml_backend_dev_get", p, [s]),
                ("ggml_backend_dev_type", ctypes.c_int, [p]),
                ("ggml_backend_dev_name", c, [p]),
                ("ggml_backend_dev_description", c, [p]),
                ("ggml_backend_buft_name", c, [p])):
            function = getattr(libggml, name)
            function.restype, function.argtypes = restype, argtypes
            setattr(self, name, function)


# Models of this process loaded on each endpoint. ggml holds a connection while a
# model on it lives, and a server serves one client at a time: greeting a server in
# use here would wait for our own connection to end, so such a server is not greeted.
_in_use: Counter = Counter()


def hold(endpoints: Sequence[str]) -> None:
    """A model was loaded on these servers (it holds their connections)."""
    _in_use.update(endpoints)


def release(endpoints: Sequence[str]) -> None:
    """A model on these servers was freed."""
    _in_use.subtract(endpoints)
    for endpoint in endpoints:
        if _in_use[endpoint] <= 0:
            del _in_use[endpoint]


def rpc_devices(endpoints: Sequence[str]) -> list[int]:
    """The ggml devices of these servers (each may offer several), in order."""
    if not rpc_available():
        raise EdgespecError(
            f"this llama-cpp-python was built without llama.cpp's RPC backend, which --rpc "
            f"needs: reinstall it with RPC on: {install_line()}")
    for endpoint in endpoints:
        if not _in_use[endpoint]:
            greet(endpoint)
    ggml = ggml_functions()
    registry = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(registry, b"ggml_backend_rpc_add_server")
    if not registry or not address:
        raise EdgespecError(f"llama.cpp's RPC backend is incomplete in this build: {install_line()}")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    devices = []
    for endpoint in endpoints:
        server = add_server(endpoint.encode())
        if not server:
            raise EdgespecError(f"rpc-server at {endpoint} offers no device: check how it was started")
        devices += [ggml.ggml_backend_reg_dev_get(server, i)
                    for i in range(ggml.ggml_backend_reg_dev_count(server))]
    return devices


def local_gpu_devices() -> list[int]:
    """This machine's GPUs, which llama.cpp offloads to after the RPC servers: its
    discrete GPUs, or if it has none its integrated ones (llama.cpp's default)."""
    ggml = ggml_functions()
    devices = [ggml.ggml_backend_dev_get(i) for i in range(ggml.ggml_backend_dev_count())]
    kinds = [ggml.ggml_backend_dev_type(d) for d in devices]
    wanted = _GPU if _GPU in kinds else _IGPU
    return [d for d, kind in zip(devices, kinds) if kind == wanted]


def device_array(devices: Sequence[int]):
    """A NULL-terminated ``ggml_backend_dev_t`` array for ``llama_model_params.devices``
    (keep it alive while the model loads)."""
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
