"""Issue 66: ``edgespec serve`` is closed to other web origins by default.

Each hostile request goes to a real server (SmolLM2, prompt lookup) as a hostile web
page or a DNS-rebinding page would send it: over httpx with the headers a browser
sends, and from a real chromium page served from another origin on another loopback
port. Each must get a 4xx that names its reason, generate nothing (the server's
``/metrics`` count no new generation and no predicted token) and leave the server up.
``--allowed-hosts`` and ``--cors-origins`` open exactly what they name.
"""

from __future__ import annotations

import http.server
import json
import re
import threading

import httpx
import pytest

from edgespec.serve.guard import MAX_BODY, Access, split_list

from test_server import HELLO, RunningServer, engine  # noqa: F401 - the module's engine fixture

CHAT = {"messages": HELLO, "max_tokens": 4}
FOREIGN = "https://evil.example"


@pytest.fixture(scope="module")
def served(engine):  # noqa: F811 - test_server's engine
    running = RunningServer(engine)
    yield running
    running.stop()


def metric(url: str, name: str, **labels) -> float:
    """A counter's value from ``/metrics`` (0 when absent)."""
    text = httpx.get(url + "/metrics").text
    label = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(label) + r"\}" if label else r"(?:\{\})?") + r" (\S+)"
    found = re.search("^" + pattern + "$", text, re.M)
    return float(found.group(1)) if found else 0.0


def generated(url: str) -> tuple[float, float]:
    """What the server has generated so far: finished generations and predicted tokens."""
    text = httpx.get(url + "/metrics").text
    finished = sum(float(v) for v in re.findall(r"^edgespec:generations_total\{.*\} (\S+)$", text, re.M))
    return finished, metric(url, "llamacpp:tokens_predicted_total")


def hostile(url: str, port: int):
    """(what, method, path, keyword arguments of httpx.request, expected status, its code)."""
    evil_host = {"Host": f"rebind.evil.example:{port}"}
    as_json = {"Content-Type": "application/json"}
    deep = b"[" * 100_000 + b"]" * 100_000
    return [
        ("rebinding Host, chat", "POST", "/v1/chat/completions",
         dict(json=CHAT, headers=evil_host), 403, "host_not_allowed"),
        ("rebinding Host, /props", "GET", "/props", dict(headers=evil_host), 403, "host_not_allowed"),
        ("rebinding Host, /v1/models", "GET", "/v1/models", dict(headers=evil_host), 403,
         "host_not_allowed"),
        ("text/plain POST, foreign Origin", "POST", "/v1/chat/completions",
         dict(content=json.dumps(CHAT), headers={"Content-Type": "text/plain", "Origin": FOREIGN}),
         403, "origin_not_allowed"),
        ("text/plain POST, no Origin", "POST", "/v1/chat/completions",
         dict(content=json.dumps(CHAT), headers={"Content-Type": "text/plain"}), 415,
         "unsupported_media_type"),
        ("POST, no Content-Type", "POST", "/completion",
         dict(content=json.dumps({"prompt": "Hi", "n_predict": 4})), 415, "unsupported_media_type"),
        ("form POST", "POST", "/completion",
         dict(data={"prompt": "Hi", "n_predict": "4"}), 415, "unsupported_media_type"),
        *[(f"foreign Origin, {path}", method, path, dict(json=body, headers={"Origin": FOREIGN}), 403,
           "origin_not_allowed")
          for method, path, body in [("POST", "/v1/chat/completions", CHAT),
                                     ("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 4}),
                                     ("POST", "/completion", {"prompt": "Hi", "n_predict": 4}),
                                     ("GET", "/props", None), ("GET", "/v1/models", None),
                                     ("GET", "/metrics", None)]],
        ("Origin: null (a sandboxed frame)", "POST", "/completion",
         dict(json={"prompt": "Hi", "n_predict": 4}, headers={"Origin": "null"}), 403,
         "origin_not_allowed"),
        ("a 20 MB body", "POST", "/v1/chat/completions",
         dict(content=b'{"messages": [{"role": "user", "content": "' + b"a" * 20_000_000 + b'"}]}',
              headers=as_json), 413, "body_too_large"),
        ("a 20 MB body, chunked", "POST", "/v1/chat/completions",
         dict(content=iter([b"[" + b"1," * 1_000_000] * 10 + [b"1]"]), headers=as_json), 413,
         "body_too_large"),
        ("10,000 messages", "POST", "/v1/chat/completions",
         dict(json={"messages": [{"role": "user", "content": "hi"}] * 10_000, "max_tokens": 4}),
         400, None),
        ("a body nested 100,000 deep", "POST", "/v1/chat/completions",
         dict(content=deep, headers=as_json), 400, None),
    ]


def test_hostile_requests_get_a_4xx_naming_why_and_generate_nothing(served):
    port = int(served.url.rsplit(":", 1)[1])
    before = generated(served.url)
    for what, method, path, options, status, code in hostile(served.url, port):
        reply = httpx.request(method, served.url + path, timeout=120, **options)
        assert reply.status_code == status, (what, reply.status_code, reply.text[:300])
        error = reply.json()["error"]
        assert error["message"] and "Traceback" not in reply.text, what
        if code:
            assert error["code"] == code, (what, error)
        assert "access-control-allow-origin" not in reply.headers, what
    assert generated(served.url) == before  # nothing was generated
    assert metric(served.url, "edgespec:requests_refused_total", reason="origin_not_allowed") >= 8
    assert metric(served.url, "edgespec:requests_refused_total", reason="host_not_allowed") >= 3
    # The server is still up and serves what it should.
    assert httpx.get(served.url + "/health").json()["status"] == "ok"
    assert served.client().chat.completions.create(model="m", messages=HELLO, max_tokens=3) \
        .usage.completion_tokens == 3


def test_hostile_messages_name_the_reason_and_the_fix(served):
    port = int(served.url.rsplit(":", 1)[1])
    messages = {code: httpx.request(method, served.url + path, timeout=120, **options).json()["error"]
                ["message"] for _, method, path, options, _, code in hostile(served.url, port)[:7]}
    assert "rebind.evil.example" in messages["host_not_allowed"] and \
        "--allowed-hosts" in messages["host_not_allowed"]
    assert FOREIGN in messages["origin_not_allowed"] and "--cors-origins" in messages["origin_not_allowed"]
    assert "application/json" in messages["unsupported_media_type"]


def test_the_servers_own_origin_and_plain_clients_are_served_without_cors_headers(served):
    port = int(served.url.rsplit(":", 1)[1])
    for origin, host in [(served.url, None), (f"http://localhost:{port}", f"localhost:{port}")]:
        headers = {"Origin": origin, **({"Host": host} if host else {})}
        reply = httpx.post(served.url + "/v1/chat/completions", json=CHAT, headers=headers, timeout=120)
        assert reply.status_code == 200, reply.text
        assert "access-control-allow-origin" not in reply.headers
    # charset parameters and +json types are JSON too
    reply = httpx.post(served.url + "/tokenize", content=json.dumps({"content": "Hi"}),
                       headers={"Content-Type": "application/json; charset=utf-8"})
    assert reply.status_code == 200 and reply.json()["tokens"]
    # A preflight from another site gets no CORS headers: the browser then sends nothing.
    preflight = httpx.options(served.url + "/v1/chat/completions",
                              headers={"Origin": FOREIGN, "Access-Control-Request-Method": "POST"})
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers


def test_allowed_hosts_open_exactly_the_names_given(engine):  # noqa: F811
    running = RunningServer(engine, access=Access(allowed_hosts=split_list("my.lan, .example.org")))
    try:
        for host, status in [("my.lan", 200), ("MY.LAN:8080", 200), ("api.example.org", 200),
                             ("example.org", 200), ("other.lan", 403), ("my.lan.evil.example", 403),
                             ("badexample.org", 403)]:
            reply = httpx.get(running.url + "/v1/models", headers={"Host": host})
            assert reply.status_code == status, (host, reply.text)
    finally:
        running.stop()


@pytest.mark.parametrize("setting, allowed, refused", [
    ("https://app.example", ["https://app.example"], [FOREIGN, "http://localhost:5173"]),
    ("localhost", ["http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]:8000"],
     [FOREIGN, "http://localhost.evil.example"]),
    ("*", [FOREIGN, "null"], []),
])
def test_cors_origins_open_exactly_the_origins_given(engine, setting, allowed, refused):  # noqa: F811
    running = RunningServer(engine, access=Access(cors_origins=split_list(setting)))
    try:
        for origin in allowed:
            preflight = httpx.options(running.url + "/v1/chat/completions", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type, authorization"})
            assert preflight.status_code == 200, (origin, preflight.text)
            assert "content-type" in preflight.headers["access-control-allow-headers"].lower()
            reply = httpx.get(running.url + "/v1/models", headers={"Origin": origin})
            assert reply.status_code == 200, (origin, reply.text)
            assert reply.headers["access-control-allow-origin"] in (origin, "*")
        for origin in refused:
            reply = httpx.get(running.url + "/v1/models", headers={"Origin": origin})
            assert reply.status_code == 403 and "access-control-allow-origin" not in reply.headers
    finally:
        running.stop()


@pytest.mark.parametrize("bound, host, allowed", [
    ("127.0.0.1", "127.0.0.1:8080", True), ("127.0.0.1", "localhost", True),
    ("127.0.0.1", "[::1]:8080", True), ("127.0.0.1", "app.localhost:8080", True),
    ("127.0.0.1", "192.168.1.20:8080", False), ("127.0.0.1", "evil.example", False),
    ("0.0.0.0", "192.168.1.20:8080", True), ("0.0.0.0", "[fe80::1]:8080", True),
    ("0.0.0.0", "evil.example:8080", False), ("192.168.1.20", "192.168.1.20", True),
    ("192.168.1.20", "10.0.0.1", False),
])
def test_the_host_rule(bound, host, allowed):
    """A DNS-rebinding page always reaches the server under a name; an address
    literal of this machine is safe when the server listens on every address."""
    assert Access(bound).host_allowed(host) is allowed


def test_the_body_limit_is_generous_for_real_prompts():
    assert MAX_BODY >= 4 * 2**20  # a 128k-token conversation is < 1 MiB of JSON


# -- a real browser on another origin --------------------------------------------------------

ATTACK = """<!doctype html><meta charset="utf-8"><body><iframe name="sink"></iframe><script>
const target = %(target)s, results = {};
async function attempt(name, request) {
  try { const r = await request(); results[name] = "read " + r.status + " " + (await r.text()).slice(0, 80); }
  catch (e) { results[name] = "blocked " + e.name; }
}
(async () => {
  const chat = JSON.stringify({messages: [{role: "user", content: "Hi"}], max_tokens: 8});
  await attempt("text/plain, no-cors", () => fetch(target + "/v1/chat/completions",
      {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: chat}));
  await attempt("blob, no type", () => fetch(target + "/completion",
      {method: "POST", mode: "no-cors", body: new Blob([JSON.stringify({prompt: "Hi", n_predict: 8})])}));
  await attempt("json", () => fetch(target + "/v1/chat/completions",
      {method: "POST", headers: {"Content-Type": "application/json"}, body: chat}));
  await attempt("props", () => fetch(target + "/props"));
  await attempt("models", () => fetch(target + "/v1/models"));
  const form = document.createElement("form");
  Object.assign(form, {method: "POST", action: target + "/completion", target: "sink"});
  form.innerHTML = '<input name="prompt" value="Hi"><input name="n_predict" value="8">';
  document.body.append(form);
  document.querySelector("iframe").onload = () => { results.form = "sent"; document.body.dataset.done = JSON.stringify(results); };
  form.submit();
})();
</script>"""


def test_a_page_from_another_origin_can_neither_generate_nor_read(tmp_path, served):
    from test_chat_page import chromium, wait
    (tmp_path / "attack.html").write_text(ATTACK % {"target": json.dumps(served.url)})
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)  # noqa: E731
    page_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=page_server.serve_forever, daemon=True).start()
    browser = chromium(flags=["--host-resolver-rules=MAP rebind.evil.example 127.0.0.1"])
    try:
        before = generated(served.url)
        refused = metric(served.url, "edgespec:requests_refused_total", reason="origin_not_allowed")
        browser.get(f"http://localhost:{page_server.server_address[1]}/attack.html")  # another origin
        done = wait(browser, lambda b: b.execute_script("return document.body.dataset.done"), timeout=60)
        results = json.loads(done)
        assert not any(r.startswith("read 200") for r in results.values()), results
        assert results["json"].startswith("blocked") and results["props"].startswith("blocked"), results
        # Every request that reached the server was refused for its origin; none generated.
        assert metric(served.url, "edgespec:requests_refused_total", reason="origin_not_allowed") \
            >= refused + 5
        assert generated(served.url) == before
        # A site whose name now points at 127.0.0.1 (DNS rebinding) gets nothing, not even the page.
        port = served.url.rsplit(":", 1)[1]
        browser.get(f"http://rebind.evil.example:{port}/v1/models")
        assert "host_not_allowed" in browser.page_source and "n_ctx" not in browser.page_source
        browser.get(served.url + "/")  # while the chat page itself loads from its own address
        wait(browser, lambda b: b.execute_script("return document.body.dataset.ready === 'true'"))
    finally:
        browser.quit()
        page_server.shutdown()
