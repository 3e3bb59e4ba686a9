"""The chat page in a real browser (Debian's chromium through Selenium) against a real
server: SmolLM2 with its Q2_K copy as draft model (k = 4), or prompt lookup where a
request asks for it. Nothing of the page or the server is mocked; the server's side is
read from the app itself (each chat request's body and streamed reply, as they passed
through it, and the server's record of finished generations).

The tests marked ``browser`` are steps of one browser session, run in order:
``python -m pytest -q -m browser tests/test_chat_page.py`` (about 2 minutes on 2 cores).
The default suite runs the headers' test and one short reply in the browser. Both skip
where chromium or chromedriver is missing (``apt install chromium chromium-driver``).
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import httpx
import pytest

import edgespec
from edgespec import SamplingParams
from edgespec.serve.server import ServerSettings, bind, create_app

SHORT = 80  # the page's max tokens in these tests: replies stay short on a busy CPU


class Recorder:
    """The app, with each chat request's body and its response's bytes kept as they
    passed through (an ASGI wrapper: the server runs as it always does)."""

    def __init__(self, app):
        self.app, self.exchanges = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            return await self.app(scope, receive, send)
        exchange = {"request": b"", "response": b"", "done": False}
        self.exchanges.append(exchange)

        async def receive_body():
            message = await receive()
            exchange["request"] += message.get("body", b"")
            return message

        async def send_body(message):
            if message["type"] == "http.response.body":
                exchange["response"] += message.get("body", b"")
                exchange["done"] = not message.get("more_body", False)
            await send(message)

        await self.app(scope, receive_body, send_body)

    def last(self) -> tuple[dict, list[dict]]:
        """The latest chat request's body and its streamed chunks (or whole reply)."""
        exchange = self.exchanges[-1]
        body = json.loads(exchange["request"])
        text = exchange["response"].decode()
        if not body.get("stream"):
            return body, [json.loads(text)]
        return body, [json.loads(line[6:]) for line in text.split("\n")
                      if line.startswith("data: {")]


class Served:
    """uvicorn serving the real app in a thread; restartable on the same port."""

    def __init__(self, engine, port: int = 0, **settings):
        import uvicorn
        self.engine = engine
        self.settings = ServerSettings((engine.target.name,), SamplingParams(temperature=0), 4,
                                       **settings)
        self.app = create_app(engine, self.settings)
        self.recorder = Recorder(self.app)
        self.sock = bind("127.0.0.1", port)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.uvicorn = uvicorn.Server(uvicorn.Config(self.recorder, log_level="warning"))
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.sock]})
        self.thread.start()

    @property
    def finished(self):
        return self.app.state.server.finished

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join()
        self.sock.close()


def chromium(downloads: Path | None = None, width: int = 1200, height: int = 850, flags=()):
    """Debian's chromium and its driver, headless (and ``flags``), or a reason to skip."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("no chromium/chromedriver here (Debian: apt install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}", *flags):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    browser = webdriver.Chrome(service=Service(driver), options=options)
    if downloads:
        browser.execute_cdp_cmd("Browser.setDownloadBehavior",
                                {"behavior": "allowAndName", "downloadPath": str(downloads)})
    return browser


@pytest.fixture(scope="module")
def engine(smollm2_path, smollm2_q2k_path):
    # One thread: the browser needs the other core.
    engine = edgespec.load(str(smollm2_path), draft=str(smollm2_q2k_path), num_draft=4,
                           n_ctx=2048, n_threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def served(engine):
    running = Served(engine)
    yield running
    running.stop()


# -- driving the page ---------------------------------------------------------------------


def wait(page, condition, timeout=180):
    """``condition(page)`` once truthy (the page redraws a conversation as it changes:
    an element found a moment ago may be gone, and is looked for again)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(page, timeout, ignored_exceptions=[StaleElementReferenceException]) \
        .until(condition)


def css(page, selector):
    from selenium.webdriver.common.by import By
    return page.find_elements(By.CSS_SELECTOR, selector)


def open_page(page, url):
    page.get(url)
    wait(page, lambda p: p.execute_script("return document.body.dataset.ready === 'true'"))


def last_assistant(page):
    replies = css(page, "#messages article.assistant")
    return replies[-1] if replies else None


def send(page, text):
    """Type a message and press Enter; returns the reply's element once it is complete."""
    from selenium.webdriver.common.keys import Keys
    before = last_assistant(page)
    before = before.get_attribute("data-id") if before else None
    box = css(page, "#message")[0]
    box.send_keys(text)
    box.send_keys(Keys.ENTER)
    return finished_reply(page, before)


def finished_reply(page, before_id):
    """The newest reply, once it differs from ``before_id`` and is no longer streaming."""
    reply_id = wait(page, lambda p: p.execute_script("""
        const replies = document.querySelectorAll("#messages article.assistant");
        const last = replies[replies.length - 1];
        return last && last.dataset.id !== arguments[0] && !last.classList.contains("streaming")
            && document.getElementById("stop").hidden && last.dataset.id;""", before_id))
    return css(page, f'article[data-id="{reply_id}"]')[0]


def stat(reply, name):
    from selenium.webdriver.common.by import By
    found = reply.find_elements(By.CSS_SELECTOR, f'[data-stat="{name}"]')
    return found[0].text if found else None


def set_settings(page, **values):
    """Open Settings, set the fields given ("" clears one), save."""
    from selenium.webdriver.support.ui import Select
    css(page, "#open-settings")[0].click()
    form = css(page, "#settings-form")[0]
    wait(page, lambda p: form.is_displayed())
    for name, value in values.items():
        field = form.find_element("name", name)
        if field.tag_name == "select":
            Select(field).select_by_value(value)
        else:
            field.clear()
            field.send_keys(str(value))
    css(page, "#save-settings")[0].click()
    wait(page, lambda p: not form.is_displayed())


def titles(page):
    return [li.text.replace("✎", "").replace("✕", "").strip() for li in css(page, "#conversations li")]


def requests_made(page) -> set[str]:
    """Every URL the browser requested since the last call (its performance log)."""
    urls = set()
    for entry in page.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.add(message["params"]["request"]["url"])
    return urls


# -- the default suite ----------------------------------------------------------------------


def test_the_page_and_its_files_have_their_types_and_cache_rules(served):
    page = httpx.get(served.url + "/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["cache-control"] == "no-cache"
    scripts = re.findall(r'src="(assets/[^"]+)"', page.text)
    styles = re.findall(r'href="(assets/[^"]+)"', page.text)
    assert scripts == ["assets/js/main.js"] and styles == ["assets/chat.css"]
    main = httpx.get(f"{served.url}/{scripts[0]}")
    assert main.headers["content-type"] == "text/javascript; charset=utf-8"
    assert main.headers["cache-control"] == "no-cache"  # (revalidated: a new version shows at once)
    again = httpx.get(f"{served.url}/{scripts[0]}", headers={"If-None-Match": main.headers["etag"]})
    assert again.status_code == 304 and not again.content
    assert httpx.get(f"{served.url}/{styles[0]}").headers["content-type"] == "text/css; charset=utf-8"
    vendor = re.findall(r'from "\.\./(vendor/[^"]+)"',
                        httpx.get(served.url + "/assets/js/markdown.js").text)
    assert len(vendor) == 3 and all(re.search(r"-\d+\.\d+\.\d+\.", name) for name in vendor)
    for name in vendor:  # versioned names: kept a year
        reply = httpx.get(f"{served.url}/assets/{name}")
        assert reply.status_code == 200 and reply.headers["content-type"] == "text/javascript; charset=utf-8"
        assert reply.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert "sourceMappingURL" not in reply.text
    for path in ("/assets/../server.py", "/assets/%2e%2e/page.py", "/assets/js/nothing.js",
                 "/assets/vendor", "/assets/.hidden.js"):
        assert httpx.get(served.url + path).status_code == 404, path


def uncarried(chunks: list[dict], drafted_tokens: int) -> int:
    """Accepted drafts that no token chunk carries: 1 where the reply ended on an accepted
    draft of the end token (counted in draft_n_accepted, never sent as text), else 0."""
    final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]][-1]
    missing = final["timings"]["draft_n_accepted"] - drafted_tokens
    assert missing == 0 or final["choices"][0]["finish_reason"] == "stop"
    return missing


def stream(url: str, body: dict) -> list[dict]:
    """A streamed chat reply's chunks, as the page reads them."""
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=300) as reply:
        return [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: {")]


@pytest.mark.parametrize("drafter, kind", [("model", "model"), ("lookup", "copy")])
def test_each_accepted_draft_token_says_what_kind_of_drafter_made_it(served, drafter, kind):
    """What the page tints by: ``draft_kind`` on each accepted draft token, and the
    rounds in ``timings`` that the mean accepted length divides by."""
    chunks = stream(served.url, {
        "messages": [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, "
                                                 "the cat sat on the mat, the cat sat on the mat."}],
        "max_tokens": 40, "speculative": {"drafter": drafter}})
    tokens = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    timings = chunks[-1]["timings"]
    drafted = [t for t in tokens if t["from_draft"]]
    assert drafted and uncarried(chunks, len(drafted)) in (0, 1)
    assert {t["draft_kind"] for t in drafted} == {kind}
    assert not any("draft_kind" in t for t in tokens if not t["from_draft"])
    assert timings["draft_rounds"] == sum(timings["draft_rounds_per_drafter"].values()) > 0
    assert timings["draft_n"] >= timings["draft_n_accepted"]


def test_a_reply_streams_into_the_page_with_its_stats(served):
    """Enter sends, Shift+Enter adds a line; the reply streams and ends with its stats."""
    from selenium.webdriver.common.keys import Keys
    page = chromium()
    try:
        open_page(page, served.url + "/")
        set_settings(page, max_tokens=SHORT)
        box = css(page, "#message")[0]
        box.send_keys("Count from one to five.")
        box.send_keys(Keys.SHIFT, Keys.ENTER)
        reply = send(page, "Use words.")
        assert css(page, "article.user .body")[0].text == "Count from one to five.\nUse words."
        body, _ = served.recorder.last()
        assert body["messages"][-1]["content"] == "Count from one to five.\nUse words."
        assert reply.text.strip() and stat(reply, "tps").endswith("tok/s")
        assert all(url.startswith(served.url + "/") for url in requests_made(page))
    finally:
        page.quit()


# -- one browser session, step by step (pytest -m browser) ---------------------------------


@pytest.fixture(scope="module")
def session(served, tmp_path_factory):
    """The browser the steps share, its downloads folder, and the server it talks to."""
    downloads = tmp_path_factory.mktemp("downloads")
    page = chromium(downloads)
    page.execute_cdp_cmd("Browser.grantPermissions", {
        "origin": served.url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    open_page(page, served.url + "/")
    set_settings(page, max_tokens=SHORT)
    state = {"page": page, "downloads": downloads, "served": served}
    yield state
    page.quit()
    if state["served"] is not served:  # (restarted by a step)
        state["served"].stop()


def new_chat(page):
    count = len(css(page, "#conversations li"))
    css(page, "#new-chat")[0].click()
    wait(page, lambda p: len(css(p, "#conversations li")) == count + 1)


@pytest.mark.browser
def test_markdown_with_a_code_block_and_its_copy_button(session):
    page = session["page"]
    new_chat(page)
    reply = send(page, "Write a Python function that adds two numbers. Use a code block.")
    code = reply.find_element("css selector", ".code pre code")
    assert "def " in code.text and code.find_elements("css selector", ".hljs-keyword")
    assert reply.find_element("css selector", ".code-head").text.startswith("python")
    button = reply.find_element("css selector", ".copy-code")
    button.click()
    wait(page, lambda p: button.text == "Copied")
    copied = page.execute_async_script(
        "navigator.clipboard.readText().then(arguments[0], e => arguments[0]('failed: ' + e))")
    assert copied == code.text.strip() + "\n" or copied.strip() == code.text.strip()


@pytest.mark.browser
def test_html_and_script_from_the_model_are_shown_as_text(session):
    page = session["page"]
    page.execute_script("window.alerts = []; window.alert = m => window.alerts.push(m);")
    new_chat(page)
    reply = send(page, "Repeat exactly: <img src=x onerror=alert(1)> and <script>alert(2)</script>")
    _, chunks = session["served"].recorder.last()
    said = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "<img src=x onerror=alert(1)>" in said and "<script>" in said  # (the model did say it)
    shown = reply.find_element("css selector", ".body").text
    assert "<img src=x onerror=alert(1)>" in shown and "<script>alert(2)</script>" in shown
    assert not css(page, "#messages img, #messages script, #messages [onerror]")
    assert page.execute_script("return window.alerts") == []


@pytest.mark.browser
def test_a_reply_stopped_mid_stream_keeps_what_came(session):
    from selenium.webdriver.common.keys import Keys
    page, served = session["page"], session["served"]
    new_chat(page)
    set_settings(page, max_tokens=1500)
    before = len(served.finished)
    box = css(page, "#message")[0]
    box.send_keys("Write a very long story about a ship.")
    box.send_keys(Keys.ENTER)
    wait(page, lambda p: len((css(p, "article.assistant.streaming .body") or [None])[0].text) > 40
         if css(p, "article.assistant.streaming .body") else False)
    box.send_keys(Keys.ESCAPE)  # Esc stops
    reply = finished_reply(page, None)
    assert stat(reply, "tokens").startswith("stopped after")
    shown = int(stat(reply, "tokens").split()[2])
    # The server saw the client go: that generation was cancelled, well short of 1500 tokens.
    wait(page, lambda p: len(served.finished) > before)
    reason, stats = served.finished[before]
    assert reason == "cancelled" and shown <= stats.generated_tokens < 1500
    set_settings(page, max_tokens=SHORT)


@pytest.mark.browser
def test_a_long_prompt_shows_its_progress_until_the_reply_starts(session):
    from selenium.webdriver.common.keys import Keys
    page, served = session["page"], session["served"]
    new_chat(page)
    # Every state of the bar the page draws, as it draws it (no polling that could miss one).
    page.execute_script("""
        window.bars = [];
        new MutationObserver(() => {
          for (const bar of document.querySelectorAll(".prompt-progress progress")) {
            const label = bar.parentElement.querySelector("span").textContent;
            const last = window.bars[window.bars.length - 1];
            if (!last || last.value !== bar.value) window.bars.push({value: bar.value, max: bar.max, label});
          }
        }).observe(document.getElementById("messages"), {childList: true, subtree: true});""")
    code = "\n".join(f"def step_{i}(state):\n    state['n'] += {i}\n    return state" for i in range(60))
    box = css(page, "#message")[0]
    page.execute_script("arguments[0].value = arguments[1];", box, f"{code}\nWhat does step_7 do?")
    box.send_keys(Keys.ENTER)
    reply = finished_reply(page, None)
    body, chunks = served.recorder.last()
    assert body["return_progress"] is True
    sent = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    total = sent[0]["total"]
    assert total - sent[0]["cache"] > 1000 and sent[-1]["processed"] == total
    bars = page.execute_script("return window.bars")
    assert bars, "no progress bar was drawn"
    values = [bar["value"] for bar in bars]
    assert values == sorted(values) and all(bar["max"] == total and bar["value"] < total for bar in bars)
    assert bars[0]["label"].startswith("Reading the prompt:") and f"of {total:,} tokens" in bars[0]["label"]
    assert not css(page, ".prompt-progress")  # gone once the reply came
    assert reply.find_element("css selector", ".body").text


@pytest.mark.browser
def test_regenerate_and_edit_keep_both_versions(session):
    page = session["page"]
    new_chat(page)
    first = send(page, "Name three fruits.")
    first_id, first_text = first.get_attribute("data-id"), first.find_element("css selector", ".body").text
    first.find_element("css selector", ".regenerate").click()
    second = finished_reply(page, first_id)
    assert second.find_element("css selector", ".version").text == "2/2"
    second.find_element("css selector", ".prev-version").click()
    wait(page, lambda p: last_assistant(p).get_attribute("data-id") == first_id)
    assert last_assistant(page).find_element("css selector", ".body").text == first_text
    assert last_assistant(page).find_element("css selector", ".version").text == "1/2"

    # Edit the question: a second version of it, with its own reply.
    user = css(page, "article.user")[-1]
    user.find_element("css selector", ".edit").click()
    area = user.find_element("css selector", ".edit textarea")
    area.clear()
    area.send_keys("Name three vegetables.")
    user.find_element("css selector", ".send-edit").click()
    edited_id = finished_reply(page, first_id).get_attribute("data-id")
    user = css(page, "article.user")[-1]
    assert user.find_element("css selector", ".body").text == "Name three vegetables."
    assert user.find_element("css selector", ".version").text == "2/2"
    user.find_element("css selector", ".prev-version").click()
    wait(page, lambda p: css(p, "article.user .body")[-1].text == "Name three fruits.")
    assert last_assistant(page).find_element("css selector", ".version").text == "2/2"  # (the latest)
    css(page, "article.user .next-version")[-1].click()
    wait(page, lambda p: css(p, "article.user .body")[-1].text == "Name three vegetables.")
    assert last_assistant(page).get_attribute("data-id") == edited_id


@pytest.mark.browser
def test_settings_are_sent_and_the_server_uses_them(session, monkeypatch):
    page, served = session["page"], session["served"]
    new_chat(page)
    set_settings(page, system="You answer in one short sentence.", temperature=0.5, top_p=0.9,
                 top_k=20, min_p=0.05, max_tokens=12, seed=7, drafter="lookup", num_draft=3)
    before = len(served.finished)
    asked = []  # what the server asked of the engine (which runs as ever)
    chat = served.engine.chat
    monkeypatch.setattr(served.engine, "chat", lambda *a, **kw: asked.append(kw) or chat(*a, **kw))
    send(page, "What is the sea?")
    monkeypatch.undo()
    body, chunks = served.recorder.last()
    assert body["messages"][0] == {"role": "system", "content": "You answer in one short sentence."}
    assert {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed")} == \
        {"temperature": 0.5, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "max_tokens": 12, "seed": 7}
    assert body["speculative"] == {"drafter": "lookup", "num_draft": 3}
    # What the server did with them: lookup at k = 3, no more than 12 tokens.
    reason, stats = served.finished[before]
    assert stats.drafter == "lookup" and stats.generated_tokens <= 12
    assert len(stats.drafted_per_position) <= 3
    assert asked[-1]["num_draft"] == 3 and asked[-1]["drafter"].name == "lookup"
    # ... for this request only: the engine's own settings stay as they were.
    assert served.engine.num_draft == 4 and served.engine.drafter is served.app.state.server.drafters.model
    assert chunks[-1]["timings"]["drafter"] == "lookup"
    set_settings(page, system="", temperature="", top_p="", top_k="", min_p="", max_tokens=SHORT,
                 seed="", drafter="", num_draft="")
    # Cleared, a field shows the server's default (/props), and sends nothing.
    css(page, "#open-settings")[0].click()
    form = css(page, "#settings-form")[0]
    temperature = form.find_element("name", "temperature")
    assert temperature.get_attribute("value") == "" and temperature.get_attribute("placeholder") == "0"
    assert form.find_element("name", "num_draft").get_attribute("placeholder") == "4"
    options = {o.get_attribute("value"): o.text for o in form.find_elements("css selector", "select option")}
    assert set(options) == {"", "lookup", "suffix", "lastline", "model", "off"}
    assert "(model)" in options[""] and served.app.state.server.drafters.model.name in options["model"]
    css(page, "#save-settings")[0].click()


def drafted(chunks) -> tuple[str, set[str], int]:
    """The text of the accepted drafts in a streamed reply, their kinds, and how many."""
    parts = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0].get("from_draft")]
    return ("".join(p["delta"]["content"] for p in parts), {p.get("draft_kind") for p in parts},
            len(parts))


def is_subsequence(short: str, long: str) -> bool:
    rest = iter(long)
    return all(char in rest for char in short)


@pytest.mark.browser
def test_the_speculative_stats_are_the_servers_timings(session):
    page, served = session["page"], session["served"]
    new_chat(page)
    reply = send(page, "List the numbers from one to twelve, one per line.")
    _, chunks = served.recorder.last()
    timings = chunks[-1]["timings"]
    text, kinds, accepted = drafted(chunks)
    assert timings["drafter"] != "none" and timings["draft_n"] > 0  # (the draft model drafted)
    assert stat(reply, "tps").split()[0] == f"{timings['predicted_per_second']:.1f}"
    assert stat(reply, "drafted") == f"drafted {timings['draft_n']}"
    assert stat(reply, "accepted") == f"accepted {timings['draft_n_accepted']}"
    assert stat(reply, "acceptance") == \
        f"acceptance {round(100 * timings['draft_n_accepted'] / timings['draft_n'])}%"
    mean = 1 + timings["draft_n_accepted"] / timings["draft_rounds"]
    assert stat(reply, "mean_length") == f"mean accepted length {mean:.2f}"
    assert timings["drafter"] in stat(reply, "drafter")
    # Every accepted draft token came as one (ASCII: one chunk each), from the draft model.
    assert accepted > 0 and uncarried(chunks, accepted) in (0, 1) and kinds == {"model"}
    tinted = "".join(s.get_attribute("textContent")
                     for s in reply.find_elements("css selector", ".body .d-model"))
    assert tinted and is_subsequence(tinted.replace("\n", ""), text.replace("\n", ""))
    assert not reply.find_elements("css selector", ".body .d-copy")
    bars = reply.find_elements("css selector", "svg.spark rect")
    assert 0 < len(bars) <= timings["draft_rounds"]

    # The toggle hides the tints.
    span = reply.find_element("css selector", ".body .d-model")
    tint = span.value_of_css_property("background-color")
    css(page, "#show-drafts")[0].click()
    assert tint != "rgba(0, 0, 0, 0)"
    assert span.value_of_css_property("background-color") == "rgba(0, 0, 0, 0)"
    css(page, "#show-drafts")[0].click()

    # × plain: this request again with the drafter off, as the server timed it.
    reply.find_element("css selector", ".measure-plain").click()
    wait(page, lambda p: stat(last_assistant(p), "x_plain"))
    body, plain = served.recorder.last()
    assert body["speculative"] == {"drafter": "off"} and not body["stream"]
    plain_tps = plain[0]["timings"]["predicted_per_second"]
    assert plain[0]["timings"]["drafter"] == "none"
    assert stat(last_assistant(page), "x_plain") == \
        f"{timings['predicted_per_second'] / plain_tps:.2f}× plain"

    # Prompt lookup's drafts are copies, tinted as such.
    set_settings(page, drafter="lookup")
    reply = send(page, "Repeat exactly: the cat sat on the mat, the cat sat on the mat.")
    _, chunks = served.recorder.last()
    text, kinds, accepted = drafted(chunks)
    assert kinds == {"copy"} and accepted > 0 and uncarried(chunks, accepted) in (0, 1)
    assert reply.find_elements("css selector", ".body .d-copy")
    assert not reply.find_elements("css selector", ".body .d-model")
    set_settings(page, drafter="")


@pytest.mark.browser
def test_rename_and_search(session):
    from selenium.webdriver.common.keys import Keys
    page = session["page"]
    names = titles(page)
    row = css(page, "#conversations li")[names.index("What is the sea?")]
    row.find_element("css selector", ".rename").click()
    field = wait(page, lambda p: css(p, "#conversations li input"))[0]
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys("The sea", Keys.ENTER)
    wait(page, lambda p: "The sea" in titles(p) and "What is the sea?" not in titles(p))
    search = css(page, "#search")[0]
    search.send_keys("vegetables")  # (a word of a message, not of a name)
    wait(page, lambda p: titles(p) == ["Name three fruits."])
    search.clear()
    search.send_keys(" ")  # (clear() sends no input event)
    wait(page, lambda p: len(titles(p)) == len(names))


@pytest.mark.browser
def test_conversations_survive_a_reload_and_a_server_restart(session, engine):
    page, served = session["page"], session["served"]
    before = titles(page)
    assert "The sea" in before  # (renamed)
    assert len(before) >= 2 and "Name three fruits." in before
    port = int(served.url.rsplit(":", 1)[1])
    served.stop()
    session["served"] = restarted = Served(engine, port=port)
    assert restarted.url == served.url  # (the same origin: the same browser storage)
    page.refresh()
    wait(page, lambda p: p.execute_script("return document.body.dataset.ready === 'true'"))
    assert titles(page) == before
    css(page, "#conversations li .open")[before.index("Name three fruits.")].click()
    wait(page, lambda p: css(p, "article.user .body")
         and css(p, "article.user .body")[-1].text == "Name three vegetables.")
    assert css(page, "article.user .version")[-1].text == "2/2"


def downloaded(downloads: Path) -> list[Path]:
    """The downloads written so far, oldest first (named by the browser: allowAndName)."""
    return sorted((f for f in downloads.iterdir() if not f.name.endswith(".crdownload")),
                  key=lambda f: f.stat().st_mtime_ns)


def export(page, downloads: Path, count: int) -> Path:
    """Click Export; the file it downloads (the ``count``-th), once written."""
    css(page, "#export")[0].click()
    return wait(page, lambda p: len(downloaded(downloads)) == count and downloaded(downloads)[-1],
                timeout=30)


@pytest.mark.browser
def test_export_then_import_gives_the_same_conversations(session):
    from selenium.webdriver.support import expected_conditions
    page, downloads = session["page"], session["downloads"]
    file = export(page, downloads, 1)
    exported = json.loads(file.read_text())
    assert exported["format"] == "edgespec-chat" and len(exported["conversations"]) == len(titles(page))
    shown = sorted(titles(page))
    while css(page, "#conversations li .delete"):  # delete them all (each asks first)
        count = len(css(page, "#conversations li"))
        css(page, "#conversations li .delete")[0].click()
        wait(page, expected_conditions.alert_is_present()).accept()
        wait(page, lambda p: len(css(p, "#conversations li")) == count - 1)
    page.refresh()
    wait(page, lambda p: p.execute_script("return document.body.dataset.ready === 'true'"))
    assert titles(page) == []
    css(page, "#import-file")[0].send_keys(str(file))
    wait(page, lambda p: len(titles(p)) == len(shown))
    assert sorted(titles(page)) == shown
    again = json.loads(export(page, downloads, 2).read_text())
    by_id = lambda data: sorted(data["conversations"], key=lambda c: c["id"])  # noqa: E731
    assert by_id(again) == by_id(exported)


@pytest.mark.browser
def test_the_page_made_no_request_outside_the_server(session):
    page, served = session["page"], session["served"]
    urls = requests_made(page)
    assert urls and all(url.startswith((served.url + "/", "blob:", "data:")) for url in urls), urls
    problems = [e["message"] for e in page.get_log("browser")
                if e["level"] == "SEVERE" and "/props" not in e["message"]]
    assert not problems  # (no CSP violation, no script error)


@pytest.mark.browser
def test_the_page_asks_once_for_the_api_key(engine):
    running = Served(engine, api_key="s3cret")
    page = chromium()
    try:
        page.get(running.url + "/")
        dialog = wait(page, lambda p: [d for d in css(p, "#key-dialog") if d.is_displayed()])[0]
        dialog.find_element("id", "key").send_keys("s3cret")
        dialog.find_element("css selector", "button[type=submit]").click()
        wait(page, lambda p: css(p, "#model")[0].text == engine.target.name)
        set_settings(page, max_tokens=8)
        send(page, "Hello!")
        assert running.recorder.last()[1][-1]["timings"]["predicted_n"] <= 8
        page.refresh()  # the key is kept: no second question
        wait(page, lambda p: p.execute_script("return document.body.dataset.ready === 'true'"))
        assert css(page, "#model")[0].text == engine.target.name
        assert not css(page, "#key-dialog")[0].is_displayed()
    finally:
        page.quit()
        running.stop()


@pytest.mark.browser
def test_themes_and_a_phones_width(session):
    """Dark and light themes; at a phone's width nothing overflows and the list is a drawer."""
    page = session["page"]
    names = titles(page)
    css(page, "#conversations li .open")[next(i for i, t in enumerate(names)
                                              if t.startswith("Write a Python function"))].click()
    wait(page, lambda p: css(p, "#messages .code"))
    backgrounds = {}
    for theme in ("light", "dark"):
        wait(page, lambda p: css(p, "#theme")[0].click()
             or p.execute_script("return document.documentElement.dataset.theme") == theme, timeout=10)
        backgrounds[theme] = page.execute_script("return getComputedStyle(document.body).backgroundColor")
    assert backgrounds["light"] != backgrounds["dark"]

    page.set_window_size(390, 844)
    try:
        wait(page, lambda p: not css(p, "#sidebar")[0].is_displayed()
             or css(p, "#sidebar")[0].rect["x"] + css(p, "#sidebar")[0].rect["width"] <= 0, timeout=10)
        assert page.execute_script("return document.documentElement.scrollWidth <= innerWidth")
        assert css(page, "#message")[0].is_displayed() and css(page, "#send")[0].is_displayed()
        css(page, "#open-sidebar")[0].click()
        wait(page, lambda p: css(p, "#sidebar")[0].rect["x"] >= 0, timeout=10)
        css(page, "#close-sidebar")[0].click()
    finally:
        page.set_window_size(1200, 850)
