"""Drives Open WebUI in headless Chromium (Playwright, Debian's `chromium` by its path) for
test_open_webui.py; run by the Python of Open WebUI's own venv, which has Playwright. Prints one
JSON object: the models Open WebUI lists, and for each chat the answer's text as it grew (sampled
every 0.5 s) and its end. Screenshots go to the folder given.

    python open_webui_browser.py URL MODEL DOCUMENT SHOTS_DIR CHROMIUM
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright

ANSWER_S = 600  # a small model on a busy 2-core machine, behind Open WebUI's own requests
QUESTION = "Explain what a rainbow is to a child, in a few sentences."
DOCUMENT_QUESTION = "Who built the Vellmar lighthouse?"


def _api(page: Page, path: str) -> Any:
    """An Open WebUI API call made by the page, with its session's token."""
    return page.evaluate("""async (path) => {
        const reply = await fetch(path, {headers: {Authorization: 'Bearer ' + localStorage.token}});
        return await reply.json();
    }""", path)


def _new_chat(page: Page, url: str, model: str) -> None:
    page.goto(url, wait_until="load", timeout=120_000)
    page.wait_for_selector("#chat-input", timeout=120_000)
    time.sleep(1)
    welcome = page.get_by_text("Okay, Let's Go!")  # the release notes, shown once
    if welcome.is_visible():
        welcome.click()
    page.locator("#model-selector-model-button").click()
    page.get_by_text(model, exact=True).first.click()
    selected = page.locator("#model-selector-model-button").inner_text().strip()
    assert selected == model, (selected, model)


def _ask(page: Page, question: str) -> dict[str, Any]:
    """Sends `question`; the answer's text as it grew, until its message shows its actions (it ended)."""
    page.locator("#chat-input").click()
    page.keyboard.type(question)
    page.keyboard.press("Enter")
    seen: list[str] = []
    deadline = time.monotonic() + ANSWER_S
    while time.monotonic() < deadline:
        time.sleep(0.1)  # a 96-token answer streams in about a second
        texts = page.locator("#response-content-container").all_inner_texts()
        if texts and (not seen or texts[-1] != seen[-1]):
            seen.append(texts[-1])
        if page.locator("button[aria-label='Regenerate']").count() and texts and texts[-1].strip():
            return {"grew": seen, "answer": texts[-1], "ended": True}
    return {"grew": seen, "answer": seen[-1] if seen else "", "ended": False}


def main() -> None:
    url, model, document, shots, chromium = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
    report: dict[str, Any] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        _new_chat(page, url, model)
        report["models"] = [[entry["id"], entry.get("owned_by")] for entry in _api(page, "/api/models")["data"]]
        page.locator("#model-selector-model-button").click()
        page.screenshot(path=str(shots / "model-list.png"))
        page.keyboard.press("Escape")
        report["ollama_chat"] = _ask(page, QUESTION)
        page.screenshot(path=str(shots / "ollama-chat.png"))

        _new_chat(page, url, f"openai.{model}")
        report["openai_chat"] = _ask(page, QUESTION)
        page.screenshot(path=str(shots / "openai-chat.png"))

        _new_chat(page, url, model)
        page.locator("input[type=file]").first.set_input_files(str(document))
        page.get_by_text(document.name).first.wait_for(timeout=60_000)
        # Open WebUI embeds the document on upload (through its RAG embedding engine); wait until it has.
        deadline = time.monotonic() + ANSWER_S
        while time.monotonic() < deadline:
            files = _api(page, "/api/v1/files/")
            files = files.get("items", files) if isinstance(files, dict) else files
            if any(f.get("filename") == document.name and f.get("data", {}).get("status") == "completed" for f in files):
                break
            time.sleep(1)
        report["document_chat"] = _ask(page, DOCUMENT_QUESTION)
        report["document_chat"]["sources"] = page.get_by_text("Source").count()
        page.screenshot(path=str(shots / "document-chat.png"))
        browser.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
