"""The target on llama.cpp's RPC backend: two real rpc-servers on 127.0.0.1.

Skipped, with the reason, where llama-cpp-python was built without RPC (the
default install) or rpc-server is not built (``python scripts/rpc_servers.py
--build``). The errors for those cases are tested everywhere.
"""

import socket
import struct
import sys
from pathlib import Path

import pytest

from edgespec import DraftModel, EdgespecError, Engine, PromptLookup, SamplingParams
from edgespec.backends.llamacpp import LlamaCppBackend
from edgespec.backends.rpc import greet, install_line, parse_endpoints, rpc_available
from edgespec.core.prompting import chat_prompt_ids
from greedy import assert_equal_up_to_a_near_tie

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from rpc_servers import LocalRpcServers, free_port  # noqa: E402

GREEDY = SamplingParams(temperature=0)
needs_rpc = pytest.mark.skipif(not rpc_available(), reason=(
    f"llama-cpp-python built without RPC; for these tests: {install_line()}"))


def rpc_server_binary() -> Path:
    from llamacpp_reference import rpc_server_path
    binary = rpc_server_path()
    if not binary.exists():
        pytest.skip("rpc-server is not built: python scripts/rpc_servers.py --build")
    return binary


@pytest.fixture(scope="module")
def servers():
    with LocalRpcServers(rpc_server_binary(), 2) as running:
        yield running


@pytest.mark.skipif(rpc_available(), reason="this llama-cpp-python has RPC")
def test_without_rpc_in_the_build_the_error_shows_how_to_install_it(smollm2_path):
    with pytest.raises(EdgespecError, match="-DGGML_RPC=on"):
        LlamaCppBackend(smollm2_path, n_ctx=256, rpc=[f"127.0.0.1:{free_port()}"])


def test_rpc_endpoints_are_checked():
    assert parse_endpoints("10.0.0.2:50052, 10.0.0.3:50052") == ("10.0.0.2:50052", "10.0.0.3:50052")
    for bad in ("10.0.0.2", "10.0.0.2:", ":50052", "10.0.0.2:port", "10.0.0.2:70000"):
        with pytest.raises(EdgespecError, match="HOST:PORT"):
            parse_endpoints(bad)


@needs_rpc
def test_a_server_that_is_not_there_is_a_clear_error_not_an_abort(smollm2_path):
    with pytest.raises(EdgespecError, match="cannot reach rpc-server"):
        LlamaCppBackend(smollm2_path, n_ctx=256, rpc=[f"127.0.0.1:{free_port()}"])


@needs_rpc
@pytest.mark.parametrize("drafter", ["draft-model", "lookup"])
def test_greedy_output_through_two_rpc_servers_equals_local_output(
        servers, smollm2_path, smollm2_q2k_path, drafter):
    local = Engine(LlamaCppBackend(smollm2_path, n_ctx=1024))
    remote = LlamaCppBackend(smollm2_path, n_ctx=1024, rpc=servers.endpoints)
    draft = PromptLookup() if drafter == "lookup" else \
        DraftModel(LlamaCppBackend(smollm2_q2k_path, n_ctx=1024), min_confidence=0.8)
    engine = Engine(remote, draft, num_draft=4)
    try:
        prompt = chat_prompt_ids(local.target, [{"role": "user", "content":
                                 "Copy this Python code exactly:\n\n"
                                 "def area(width, height):\n    return width * height\n\n"
                                 "def perimeter(width, height):\n    return 2 * (width + height)\n"}])
        plain = local.generate(prompt, GREEDY, max_tokens=64, speculative=False)
        through_rpc = engine.generate(prompt, GREEDY, max_tokens=64, speculative=False)
        spec = engine.generate(prompt, GREEDY, max_tokens=64)
        assert spec.stats.accepted > 0 and spec.stats.rounds > 0
        # Both servers hold a share of the weights and served this process.
        assert servers.served() == [True, True]
        assert min(servers.resident_bytes()) > 0.25 * smollm2_path.stat().st_size
        # The servers' CPU kernels may round a near-tie differently from this process's.
        assert_equal_up_to_a_near_tie(local, prompt, plain.token_ids, through_rpc.token_ids)
        assert_equal_up_to_a_near_tie(local, prompt, plain.token_ids, spec.token_ids)
    finally:
        engine.close()
        local.close()


@needs_rpc
def test_a_busy_server_is_a_clear_error_not_a_hang_nor_its_death():
    """An rpc-server serves one client at a time: while another holds it, a greeting
    times out with a message saying so (ggml itself would wait forever). The server
    answers that greeting once free; answering a closed connection would kill an
    rpc-server started as usual (SIGPIPE), so the greeting leaves with a reset."""
    with LocalRpcServers(rpc_server_binary(), 1, ignore_sigpipe=False) as server:
        endpoint = server.endpoints[0]
        host, _, port = endpoint.rpartition(":")
        with socket.create_connection((host, int(port))) as other_client:
            other_client.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24))  # HELLO
            other_client.recv(8)
            with pytest.raises(EdgespecError, match="one client at a time"):
                greet(endpoint, timeout=1.0)
        assert greet(endpoint)[0] >= 1  # free again once that client left, and alive
        assert server.processes[0].poll() is None
