"""The web page in headless Chromium against a real `turnstile serve` on SmolLM2 (tests/web/conftest.py):
chat with streamed replies and the cache bar, fork and undo, stop, an agents room, two keys, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.process import ServeProcess
from tests.web.conftest import KEYS

SHOTS = os.environ.get("TURNSTILE_WEB_SCREENSHOTS")  # a folder for the docs' screenshots (docs/img), else tmp


def messages(server: ServeProcess, name: str, sid: str) -> list[tuple[str, str]]:
    req = urllib.request.Request(f"{server.url}/v1/sessions/{sid}", headers={"Authorization": f"Bearer {KEYS[name]}"})
    with urllib.request.urlopen(req) as r:
        return [(m["role"], m["content"]) for m in json.load(r)["messages"]]


def settings(page: Any, **values: Any) -> None:
    page.click("#btn-settings")
    for name, value in values.items():
        page.fill(f"#settings [name={name}]", str(value))
    page.click("#btn-settings")


def new_session(page: Any, name: str) -> None:
    page.get_by_test_id("new-session").click()
    page.get_by_test_id("ask-input").fill(name)
    page.get_by_test_id("ask-ok").click()
    page.wait_for_selector(f"[data-testid=chat-title]:text-is('{name}')")


def send(page: Any, text: str) -> None:
    page.get_by_test_id("input").fill(text)
    page.get_by_test_id("input").press("Enter")


def wait_streaming(page: Any) -> str:
    """Wait until a reply is streaming (the live bubble has text); that text."""
    page.wait_for_function(
        "() => { const t = document.querySelector('[data-testid=msg-live] [data-testid=msg-text]');"
        " return t && t.textContent.length > 0; }"
    )
    text: str = page.inner_text("[data-testid=msg-live] [data-testid=msg-text]")
    return text


def wait_idle(page: Any) -> None:
    page.wait_for_selector("[data-testid=send]")
    page.wait_for_selector("[data-testid=msg-live]", state="detached")


def test_chat_streams_and_the_second_turn_is_cached(open_page: Any, server: ServeProcess, tmp_path: Path) -> None:
    page = open_page("alice")
    new_session(page, "colours")
    settings(page, temperature=0, max_tokens=16)
    send(page, "Tell me about the colour blue.")
    assert wait_streaming(page)
    wait_idle(page)
    first = page.get_by_test_id("msg-assistant").last.get_by_test_id("msg-text").inner_text()
    assert first and page.get_by_test_id("input").input_value() == ""
    # Shift+Enter is a new line, Enter sends
    page.get_by_test_id("input").fill("And green?")
    page.get_by_test_id("input").press("Shift+Enter")
    assert page.get_by_test_id("input").input_value() == "And green?\n"
    page.get_by_test_id("input").fill("And the colour green?")
    page.get_by_test_id("input").press("Enter")
    wait_streaming(page)
    wait_idle(page)
    bars = page.get_by_test_id("turnbar")
    assert bars.count() == 2
    second = bars.nth(1)
    assert int(second.get_attribute("data-cached") or 0) > 0
    assert second.get_attribute("data-source") in ("slot", "ram")
    assert len(messages(server, "alice", "colours")) == 4  # user, assistant, user, assistant
    # the engine view shows the session's state in the slot
    page.wait_for_selector("[data-testid=locations] li[data-session='colours']")
    page.wait_for_selector("#queue-empty:not([hidden])")
    page.wait_for_selector("[data-testid=slot][data-phase=idle]")
    page.screenshot(path=str(Path(SHOTS or tmp_path) / "web.png"))

    # fork: a copy with the same messages, opened
    page.get_by_test_id("fork").click()
    page.get_by_test_id("ask-input").fill("colours-2")
    page.get_by_test_id("ask-ok").click()
    page.wait_for_selector("[data-testid=chat-title]:text-is('colours-2')")
    assert messages(server, "alice", "colours-2") == messages(server, "alice", "colours")
    assert page.get_by_test_id("msg-assistant").count() == 2
    assert page.input_value("#settings [name=max_tokens]") == "16"  # the fork keeps the session's settings
    # undo: the fork loses its last exchange, the original keeps it
    page.get_by_test_id("undo").click()
    page.wait_for_function("() => document.querySelectorAll('[data-testid=msg-assistant]').length === 1")
    assert len(messages(server, "alice", "colours-2")) == 2
    assert len(messages(server, "alice", "colours")) == 4
    # regenerate: the last reply again (a chat turn with the conversation up to its user message)
    page.get_by_test_id("regenerate").click()
    wait_streaming(page)
    wait_idle(page)
    assert [r for r, _ in messages(server, "alice", "colours-2")] == ["user", "assistant"]
    # edit the user message: replaced, answered anew
    page.get_by_test_id("msg-user").first.get_by_test_id("edit").click()
    page.fill(".edit-area", "Tell me about the colour red.")
    page.click("text=Save and answer")
    wait_streaming(page)
    wait_idle(page)
    edited = messages(server, "alice", "colours-2")
    assert [r for r, _ in edited] == ["user", "assistant"] and edited[0][1] == "Tell me about the colour red."
    assert messages(server, "alice", "colours")[0][1] == "Tell me about the colour blue."


def test_stop_cancels_the_turn(open_page: Any, server: ServeProcess) -> None:
    page = open_page("alice")
    new_session(page, "stopped")
    settings(page, temperature=0, max_tokens=1500)
    send(page, "Write a very long story about a lighthouse keeper.")
    wait_streaming(page)
    page.get_by_test_id("stop").click()
    page.wait_for_selector("#notice:has-text('Stopped')")
    wait_idle(page)
    assert messages(server, "alice", "stopped") == []  # the session gained nothing
    assert page.get_by_test_id("msg-assistant").count() == 0


def test_agents_room_three_agents_six_turns_in_order(open_page: Any, tmp_path: Path) -> None:
    page = open_page("alice")
    page.click("#tab-room")
    form = page.locator("#room-form")
    form.locator("[name=agents]").fill("3")
    form.locator("[name=rounds]").fill("2")
    form.locator("[name=max_tokens]").fill("16")
    form.locator("[name=temperature]").fill("0")
    page.get_by_test_id("room-start").click()
    page.wait_for_function("() => document.querySelectorAll('[data-testid=room-turn][data-done=\"1\"]').length === 6")
    turns = page.get_by_test_id("room-turn")
    agents = [turns.nth(i).get_attribute("data-agent") for i in range(turns.count())]
    assert agents == ["historian", "engineer", "poet"] * 2
    assert [turns.nth(i).get_attribute("data-index") for i in range(6)] == [str(i) for i in range(6)]
    page.wait_for_selector("[data-testid=room-status]:has-text('done: 6 turns')")
    bars = page.get_by_test_id("room-turns").get_by_test_id("turnbar")
    assert bars.count() == 6 and all(int(bars.nth(i).get_attribute("data-cached") or 0) > 0 for i in range(3, 6))
    sessions = page.get_by_test_id("sessions").locator("li").all_inner_texts()
    assert len([s for s in sessions if s.startswith("room-")]) == 3
    page.wait_for_selector("[data-testid=slot][data-phase=idle]")
    page.screenshot(path=str(Path(SHOTS or tmp_path) / "web-room.png"))


def test_two_keys_see_only_their_own_sessions(open_page: Any) -> None:
    alice, bob = open_page("alice"), open_page("bob")
    new_session(alice, "alice-only")
    new_session(bob, "bob-only")
    alice.reload()  # the key stays in the tab (sessionStorage): no question
    alice.wait_for_selector("body[data-ready='1']")
    alice_sessions = alice.get_by_test_id("sessions").locator("li").all_inner_texts()
    bob.wait_for_selector("[data-testid=sessions] li[data-session='bob-only']")
    bob_sessions = bob.get_by_test_id("sessions").locator("li").all_inner_texts()
    assert "alice-only" in alice_sessions and "bob-only" not in alice_sessions
    assert bob_sessions == ["bob-only"]


def test_a_wrong_key_is_asked_again(browser: Any, server: ServeProcess) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(server.url + "/")
        page.get_by_test_id("ask-input").fill("not-a-key")
        page.get_by_test_id("ask-ok").click()
        page.wait_for_selector("#ask-title:has-text('That key was not accepted')")
        page.get_by_test_id("ask-input").fill(KEYS["bob"])
        page.get_by_test_id("ask-ok").click()
        page.wait_for_selector("body[data-ready='1']")
        page.wait_for_selector("[data-testid=engine-state]:has-text('live')")
    finally:
        context.close()


def test_serve_prints_the_page_address() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "serve", "--scripted", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    try:
        assert proc.stdout is not None
        listening = proc.stdout.readline()
        page = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(30)
    url = listening.split("listening on ", 1)[1].split()[0]
    assert page == f"turnstile serve: web page at {url}/ (chat, agents room, engine view)\n"
