"""Issue 34: the console shows nothing without its token, changes nothing without its CSRF token, and answers only to
loopback names; a page fails alone. Through a real ``impyard console`` process and a real browser."""

from __future__ import annotations

import socket
import subprocess
from typing import Any

import pytest
import requests

from impyard.clock import SystemClock
from impyard.gateway.audit import AuditLog, AuditRecord
from impyard.storage.db import open_database
from tests.console.conftest import CLI, TOKEN, Console

SECRET_ROW = "audit-row-only-the-operator-sees-7f3a"


def write_audit(**fields: Any) -> None:
    db = open_database()
    try:
        AuditLog(db, SystemClock()).write(AuditRecord(**{"imp": "pip", "method": "model.request", **fields}))
    finally:
        db.close()


def test_without_the_token_nothing_is_shown(console: Console) -> None:
    write_audit(verdict="allowed", detail=SECRET_ROW)
    stranger = requests.Session()
    for path in ("/", "/audit", "/audit?imp=pip", "/static/console.css", "/static/console.js", "/nowhere"):
        answer = stranger.get(console.base + path, timeout=30, allow_redirects=False)
        assert answer.status_code == 401, (path, answer.status_code)
        assert SECRET_ROW not in answer.text
        assert "impyard console" in answer.text  # says where the address is
    wrong = stranger.get(
        console.base + "/audit?token=not-the-token-at-all", timeout=30, allow_redirects=False
    )
    assert wrong.status_code == 401 and SECRET_ROW not in wrong.text
    forged = stranger.get(console.base + "/audit", cookies={"impyard_console": "forged"}, timeout=30)
    assert forged.status_code == 401


def test_the_token_once_gives_a_cookie_and_leaves_the_address(console: Console) -> None:
    write_audit(verdict="allowed", detail=SECRET_ROW)
    fresh = requests.Session()
    answer = fresh.get(f"{console.base}/audit?imp=pip&token={TOKEN}", timeout=30, allow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["Location"] == "/audit?imp=pip"  # the token is gone from the address
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    page = fresh.get(console.base + answer.headers["Location"], timeout=30)
    assert page.status_code == 200 and SECRET_ROW in page.text


def test_a_script_may_send_the_token_as_a_bearer(console: Console) -> None:
    write_audit(verdict="denied", rule="send-untrusted", detail=SECRET_ROW)
    answer = requests.get(console.base + "/audit", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert answer.status_code == 200 and SECRET_ROW in answer.text
    wrong = requests.get(console.base + "/audit", headers={"Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401


def test_a_change_needs_the_csrf_token_and_the_consoles_origin(console: Console) -> None:
    # No page takes a POST at /audit: past the CSRF check the router says 405; before it, 403.
    bare = console.session.post(console.base + "/audit", data={"x": "1"}, timeout=30)
    assert bare.status_code == 403 and "CSRF" in bare.text
    wrong = console.session.post(console.base + "/audit", data={"csrf": "0" * 64}, timeout=30)
    assert wrong.status_code == 403
    elsewhere = console.post("/audit", headers={"Origin": "http://evil.example"})
    assert elsewhere.status_code == 403 and "evil.example" in elsewhere.text
    header = console.session.post(console.base + "/audit", headers={"X-CSRF-Token": console.csrf}, timeout=30)
    assert header.status_code == 405
    assert console.post("/audit", headers={"Origin": console.base}).status_code == 405


def test_only_loopback_names_are_answered(console: Console) -> None:
    rebound = console.session.get(console.base + "/audit", headers={"Host": "evil.example:8787"}, timeout=30)
    assert rebound.status_code == 400 and "loopback" in rebound.text
    local = requests.get(
        console.base + "/audit", headers={"Host": "localhost", "Authorization": f"Bearer {TOKEN}"}, timeout=30
    )
    assert local.status_code == 200


def test_every_answer_carries_the_security_headers(console: Console) -> None:
    for answer in (console.get("/audit"), requests.get(console.base + "/audit", timeout=30)):
        assert "script-src 'self'" in answer.headers["Content-Security-Policy"]
        assert "frame-ancestors 'none'" in answer.headers["Content-Security-Policy"]
        assert (
            answer.headers["Referrer-Policy"] == "same-origin"
        )  # no Referer leaves; a form post has its Origin
        assert answer.headers["Cache-Control"] == "no-store"
        assert answer.headers["X-Frame-Options"] == "DENY"


def test_the_audit_page_filters_like_the_cli(console: Console) -> None:
    write_audit(verdict="allowed", rule="model-default", detail="first-row-a1")
    write_audit(
        imp="bo", method="discord.send", verdict="denied", rule="send-untrusted", detail="second-row-b2"
    )
    everything = console.get("/audit").text
    assert "first-row-a1" in everything and "second-row-b2" in everything
    denied = console.get("/audit?verdict=denied").text
    assert "second-row-b2" in denied and "first-row-a1" not in denied
    assert "first-row-a1" in console.get("/audit?imp=pip&method=model.request").text
    assert "no audit rows match" in console.get("/audit?rule=no-such-rule").text
    bad = console.get("/audit?before=yesterday")
    assert bad.status_code == 400 and "whole number" in bad.text
    cli = subprocess.run(
        [*CLI, "audit", "tail", "--verdict", "denied", "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "second-row-b2" in cli.stdout and "first-row-a1" not in cli.stdout


def test_a_bad_console_token_setting_is_one_line() -> None:
    done = subprocess.run(
        [*CLI, "console", "--port", "0"],
        capture_output=True, text=True, timeout=60, env={**__import__("os").environ, "IMPYARD_CONSOLE_TOKEN": "short"},
    )  # fmt: skip
    assert done.returncode != 0
    assert "IMPYARD_CONSOLE_TOKEN must be" in done.stderr and "Traceback" not in done.stderr


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*CLI, "console", "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_in_a_browser_the_printed_address_logs_in(console: Console, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    write_audit(verdict="allowed", detail=SECRET_ROW)
    browser.get(console.base + "/audit")
    assert SECRET_ROW not in browser.page_source and "impyard console" in browser.page_source
    browser.get(console.login_url)
    assert browser.current_url == console.base + "/imps"  # / leads to the first page; the token is gone
    assert TOKEN not in browser.current_url
    browser.find_element(By.LINK_TEXT, "Audit").click()
    assert SECRET_ROW in browser.find_element(By.ID, "audit-rows").text


def test_the_console_answers_health_and_metrics_on_its_own_port(impyard_home: object) -> None:
    from tests.console.conftest import start_console, stop_console

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    running = start_console(None, "--metrics-port", str(port))
    try:
        base = f"http://127.0.0.1:{port}"
        assert requests.get(base + "/healthz", timeout=30).status_code == 200
        ready = requests.get(base + "/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
        assert "# TYPE impyard_turns_total counter" in requests.get(base + "/metrics", timeout=30).text
    finally:
        stop_console(running)
