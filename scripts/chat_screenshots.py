"""The chat page's screenshots in docs/ (light, dark, a phone's width), from a real
``edgespec serve`` (SmolLM2, prompt lookup with k = 8) driven in headless Chromium:
a conversation whose second reply copies code from the first, and its x plain measured.

    python scripts/chat_screenshots.py [--out docs]

Needs chromium and chromium-driver (Debian: apt install chromium chromium-driver) and
selenium (the dev extras). The replies are SmolLM2's at temperature 0.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parent.parent
ASK = "Write a Python function that adds two numbers. Use a code block."
EDIT = "Add a docstring to the first function and show the code again."  # (copies turn 1)


def serve() -> tuple[subprocess.Popen, str]:
    """``edgespec serve`` on a free port: the process and its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "serve", "-m", "smollm2-135m-instruct", "-d", "lookup", "--num-draft", "8",
         "--port", "0", "--ctx", "2048", "--temp", "0"],
        stderr=subprocess.PIPE, text=True, cwd=ROOT)
    for line in process.stderr:
        if "http://" in line:
            return process, line.split("on ", 1)[1].split()[0]
    raise SystemExit("edgespec serve did not start")


def browser(width: int, height: int) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def send(page, text: str) -> None:
    count = len(page.find_elements(By.CSS_SELECTOR, "article.assistant .stats"))
    box = page.find_element(By.ID, "message")
    for i, line in enumerate(text.split("\n")):
        if i:
            box.send_keys(Keys.SHIFT, Keys.ENTER)
        box.send_keys(line)
    box.send_keys(Keys.ENTER)
    WebDriverWait(page, 300).until(
        lambda p: len(p.find_elements(By.CSS_SELECTOR, "article.assistant .stats")) > count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs"))
    out = Path(parser.parse_args().out)
    process, url = serve()
    page = browser(1200, 820)
    try:
        page.get(url + "/")
        WebDriverWait(page, 60).until(lambda p: p.execute_script("return document.body.dataset.ready"))
        page.find_element(By.ID, "open-settings").click()
        page.find_element(By.NAME, "max_tokens").send_keys("200")
        page.find_element(By.ID, "save-settings").click()
        send(page, "What is speculative decoding, in two sentences?")
        page.find_element(By.ID, "new-chat").click()
        send(page, ASK)
        send(page, EDIT)
        page.find_elements(By.CSS_SELECTOR, "article.assistant .measure-plain")[-1].click()
        WebDriverWait(page, 300).until(lambda p: p.find_elements(By.CSS_SELECTOR, '[data-stat="x_plain"]'))
        for theme in ("light", "dark"):
            while page.execute_script("return document.documentElement.dataset.theme") != theme:
                page.find_element(By.ID, "theme").click()
            page.execute_script("document.getElementById('messages').scrollTop = 1e6")
            page.save_screenshot(str(out / f"chat-page-{theme}.png"))
        page.set_window_size(390, 844)
        WebDriverWait(page, 10).until(  # (the list slides away: a drawer at this width)
            lambda p: p.execute_script("return document.getElementById('sidebar')"
                                       ".getBoundingClientRect().right <= 0"))
        page.execute_script("document.getElementById('messages').scrollTop = 1e6")
        page.save_screenshot(str(out / "chat-page-phone.png"))
        print(f"wrote {out}/chat-page-{{light,dark,phone}}.png")
    finally:
        page.quit()
        process.terminate()
        process.wait(timeout=60)


if __name__ == "__main__":
    main()
