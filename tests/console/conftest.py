"""The console as an operator meets it: a real ``impyard console`` process on the test's home, and a real browser.

* ``console``: ``python -m impyard console --port 0`` on this test's IMPYARD_HOME (conftest's ``impyard_home``),
  started with a known token; the printed line gives its address. ``console.session`` is a ``requests`` session
  that logged in with the token (a browser's cookie); ``console.csrf`` is the token a form must carry.
* ``browser``: Debian's chromium, headless, driven by Selenium through Debian's chromedriver (the versions match:
  one package source). Skipped with a reason where they are not installed (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests

from impyard.console.auth import Keys

T = TypeVar("T")
CLI = (sys.executable, "-c", "from impyard.cli import main; main()")  # the impyard command of this tree
TOKEN = "console-test-token-0123456789abcdef"
START_TIMEOUT_S = 60
LOGIN_LINE = re.compile(r"impyard console: (http://\S+)/\?token=(\S+)")
CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")


@dataclass
class Console:
    base: str
    token: str
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)
    session: requests.Session = field(default_factory=requests.Session)

    @property
    def csrf(self) -> str:
        return Keys(self.token).csrf

    @property
    def login_url(self) -> str:
        return f"{self.base}/?token={self.token}"

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.session.get(self.base + path, timeout=30, **kwargs)

    def post(self, path: str, data: dict[str, str] | None = None, **kwargs: Any) -> requests.Response:
        """A form post as the console's own page sends it (with the CSRF token unless ``data`` has one)."""
        form = {"csrf": self.csrf, **(data or {})}
        return self.session.post(self.base + path, data=form, timeout=30, **kwargs)


def start_console(env: dict[str, str] | None = None, *args: str) -> Console:
    """A console process on this test's home; its first stdout line names the address."""
    environ = {**os.environ, "IMPYARD_CONSOLE_TOKEN": TOKEN, **(env or {})}
    process = subprocess.Popen(
        [*CLI, "console", "--port", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ,
    )  # fmt: skip
    output: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line.rstrip("\n"))
            if LOGIN_LINE.search(line):
                found.set()
        found.set()  # the process ended

    threading.Thread(target=read, daemon=True).start()
    found.wait(START_TIMEOUT_S)
    match = next((m for line in output if (m := LOGIN_LINE.search(line))), None)
    if match is None:
        process.kill()
        raise AssertionError("impyard console did not print its address:\n" + "\n".join(output))
    console = Console(base=match.group(1), token=match.group(2), process=process, output=output)
    return console


def stop_console(console: Console) -> None:
    console.session.close()
    if console.process.poll() is None:
        console.process.terminate()
        try:
            console.process.wait(30)
        except subprocess.TimeoutExpired:
            console.process.kill()
            console.process.wait(30)


@pytest.fixture
def console(impyard_home: Path) -> Iterator[Console]:
    """A running console on this test's home, logged in (``console.session``)."""
    running = start_console()
    try:
        answer = running.session.get(running.login_url, timeout=30)
        assert answer.status_code == 200, answer.text
        yield running
    finally:
        stop_console(running)


def _first(paths: tuple[str, ...]) -> str | None:
    return next((p for p in paths if Path(p).exists()), None) or shutil.which(Path(paths[0]).name)


def settled(browser: Any, read: Callable[[Any], T], timeout_s: float = 30) -> T:
    """``read(browser)`` on a page whose live parts are replaced on a timer (Now, Hosts, Approvals' decided list):
    read again whenever an element went while it was being read, never a StaleElementReferenceException."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    got: list[T] = []

    def attempt(b: Any) -> bool:
        got.append(read(b))
        return True

    WebDriverWait(browser, timeout_s, ignored_exceptions=(StaleElementReferenceException,)).until(attempt)
    return got[-1]


@pytest.fixture(scope="session")
def _chromium() -> Iterator[Any]:
    browser_path, driver_path = _first(CHROMIUM), _first(CHROMEDRIVER)
    if browser_path is None or driver_path is None:
        pytest.skip(
            "the browser tests need Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser_path
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,900", "--disable-extensions", "--no-first-run"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(_chromium: Any) -> Iterator[Any]:
    """The session's headless chromium, with no cookie from an earlier test."""
    _chromium.delete_all_cookies()
    yield _chromium
    _chromium.delete_all_cookies()
