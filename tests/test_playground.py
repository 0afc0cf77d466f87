"""The browser playground (``GET /``) in a real headless Chromium against a real server on 127.0.0.1:
an answerable and an unanswerable question, the rendered highlight checked against the API's offsets,
the rule that declined a question, batch mode, the server's error message shown, the API key field
(only after a 401), content types and CSP, and the switch that turns it off."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_helpers import ServerProcess

from bench.browser import CHROMIUM, headless_chromium
from server.api.playground import CONTENT_SECURITY_POLICY, FILES


@pytest.fixture(scope="module")
def playground_server(onnx_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = ServerProcess(onnx_export, tmp_path_factory.mktemp("logs")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Debian's chromium + chromium-driver (.ci/run installs them): a missing browser is a failure."""
    with headless_chromium() as driver:
        yield driver


SET_VALUE = (
    "arguments[0].value = arguments[1];arguments[0].dispatchEvent(new Event('input', {bubbles: true}));"
)


def _ask(driver, url: str, context: str, question: str, threshold: str = "", batch: bool = False) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url + "/")
    wait = WebDriverWait(driver, 30)
    wait.until(ec.text_to_be_present_in_element((By.ID, "model-line"), "threshold"))
    for element_id, value in (("context", context), ("question", question), ("threshold", threshold)):
        field = driver.find_element(By.ID, element_id)
        field.clear()
        if len(value) > 1000 or any(ord(c) > 0xFFFF for c in value):
            # set through the page: 20,000 keystrokes through WebDriver can outlast its 120 s on a busy
            # machine, and ChromeDriver types no character outside the BMP (an emoji) since Chromium 150
            driver.execute_script(SET_VALUE, field, value)
        elif value:
            field.send_keys(value)
    if batch != driver.find_element(By.ID, "batch").is_selected():
        driver.find_element(By.CSS_SELECTOR, "label[for=batch]").click()
    driver.find_element(By.ID, "ask").click()
    wait.until(
        lambda d: (
            d.find_element(By.ID, "result").get_attribute("data-done")
            or d.find_element(By.ID, "error").is_displayed()
        )
    )


def _visible(driver, element_id: str) -> bool:
    """Shown by computed style and by WebDriver's rules (a stylesheet's display rule must not beat the
    element's ``hidden`` attribute)."""
    from selenium.webdriver.common.by import By

    element = driver.find_element(By.ID, element_id)
    styled = driver.execute_script("return getComputedStyle(arguments[0]).display !== 'none'", element)
    return styled and element.is_displayed()


# The ids of elements that carry the hidden attribute yet are laid out (there should be none).
HIDDEN_BUT_SHOWN = (
    "return [...document.querySelectorAll('[hidden]')]"
    ".filter(e => getComputedStyle(e).display !== 'none').map(e => e.id || e.tagName)"
)


def _bar(text: str) -> float:
    """The P(answerable) a rule line says the rule asks for ("... P(answerable) ≥ 0.500 ...")."""
    found = re.search(r"P\(answerable\) ≥ (\d+\.\d+)", text)
    assert found, text
    return float(found.group(1))


def _api(url: str, body: dict) -> dict:
    r = httpx.post(url + "/answer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


CONTEXT = (
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region "
    "in France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway."
)


def test_answerable_question_is_highlighted_at_the_api_offsets(
    playground_server, browser, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    question = "Who gave their name to Normandy?"
    _ask(browser, playground_server.url, CONTEXT, question, threshold="1")  # 1: the best span, always
    expected = _api(
        playground_server.url, {"question": question, "context": CONTEXT, "top_k": 5, "threshold": 1.0}
    )
    assert not expected["is_impossible"] and expected["start"] >= 0
    mark = browser.find_element(By.CSS_SELECTOR, "#context-view mark")
    assert (int(mark.get_attribute("data-start")), int(mark.get_attribute("data-end"))) == (
        expected["start"],
        expected["end"],
    )
    # the API's answer is its span of the context; the highlight shows it (WebDriver trims the text it reads)
    assert expected["answer"] == CONTEXT[expected["start"] : expected["end"]]
    assert mark.text == expected["answer"].strip() != ""
    view = browser.find_element(By.ID, "context-view").text
    assert view.replace("\n", " ") == CONTEXT  # the whole context, the answer inside it
    assert browser.find_element(By.ID, "answer-line").get_attribute("data-impossible") == "false"
    assert browser.find_element(By.ID, "threshold-used").text == "1"
    assert f"{expected['no_answer_prob']:.4f}" == browser.find_element(By.ID, "no-answer-prob").text
    rows = browser.find_elements(By.CSS_SELECTOR, "#nbest tbody tr")
    assert (
        len(rows) == len(expected["n_best"])
        and rows[0].find_elements(By.TAG_NAME, "td")[0].text == (expected["n_best"][0]["text"])
    )
    assert "total" in browser.find_element(By.ID, "timing").text
    shot = tmp_path / "playground.png"
    assert browser.save_screenshot(str(shot)) and shot.read_bytes().startswith(b"\x89PNG")


def test_the_highlight_counts_characters_as_the_api_does(playground_server, browser) -> None:
    """Offsets are code points; an emoji is two UTF-16 units in JavaScript: the highlight must not shift."""
    from selenium.webdriver.common.by import By

    context = "\U0001f600\U0001f30d Emoji first. " + CONTEXT
    question = "Where is Normandy?"
    _ask(browser, playground_server.url, context, question, threshold="1")
    expected = _api(playground_server.url, {"question": question, "context": context, "threshold": 1.0})
    mark = browser.find_element(By.CSS_SELECTOR, "#context-view mark")
    assert (
        mark.text == expected["answer"].strip()
        and expected["answer"] == context[expected["start"] : expected["end"]]
    )


def test_unanswerable_question_has_no_highlight(playground_server, browser) -> None:
    from selenium.webdriver.common.by import By

    question = "What is the capital of Mars?"
    _ask(browser, playground_server.url, CONTEXT, question, threshold="0")  # 0: any p(no answer) wins
    expected = _api(playground_server.url, {"question": question, "context": CONTEXT, "threshold": 0.0})
    assert expected["is_impossible"] and expected["start"] == -1
    assert browser.find_elements(By.CSS_SELECTOR, "#context-view mark") == []
    assert browser.find_element(By.ID, "answer-line").get_attribute("data-impossible") == "true"
    assert browser.find_element(By.ID, "answer-line").text.startswith("No answer")


def test_no_answer_says_which_rule_declined_it(playground_server, browser) -> None:
    """ "No answer" beside a P(answerable) above one half is explained by the rule and the bar it set."""
    from selenium.webdriver.common.by import By

    question = "Who gave their name to Normandy?"
    url = playground_server.url
    # the model's own rule: no threshold from the request or the server
    model = _api(url, {"question": question, "context": CONTEXT})
    info = httpx.get(url + "/v1/model").json()
    assert model["is_impossible"], "the tiny model declines this question at its own threshold"
    assert model["rule"] == "cls" and model["threshold"] == info["no_answer_threshold"]
    _ask(browser, url, CONTEXT, question)
    assert _visible(browser, "why")
    why = browser.find_element(By.ID, "why").text
    assert "the model's no-answer threshold" in why
    assert _bar(why) == pytest.approx(1 - model["threshold"], abs=5e-4)
    assert f"{model['answerable_prob']:.3f}" in why
    # the request's own threshold, set below this question's p(no answer)
    threshold = round(model["no_answer_prob"] / 2, 3)
    _ask(browser, url, CONTEXT, question, threshold=str(threshold))
    asked = _api(url, {"question": question, "context": CONTEXT, "threshold": threshold})
    assert asked["is_impossible"] and asked["rule"] == "request"
    why = browser.find_element(By.ID, "why").text
    assert "the no-answer threshold you set" in why
    assert _bar(why) == pytest.approx(1 - asked["threshold"], abs=5e-4)
    # an answer has nothing to explain
    _ask(browser, url, CONTEXT, question, threshold="1")
    assert browser.find_element(By.ID, "answer-line").get_attribute("data-impossible") == "false"
    assert not _visible(browser, "why")


def test_the_servers_own_threshold_is_named_as_the_rule(
    onnx_export: Path, playground_server, browser, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    question = "Where is Normandy?"
    probe = _api(playground_server.url, {"question": question, "context": CONTEXT})
    flag = round(probe["no_answer_prob"] / 2, 3)  # below the question's p(no answer): it is declined
    with ServerProcess(onnx_export, tmp_path, "--no-answer-threshold", str(flag)) as s:
        answered = _api(s.url, {"question": question, "context": CONTEXT})
        info = httpx.get(s.url + "/v1/model").json()
        assert answered["is_impossible"] and answered["rule"] == "server"
        assert answered["threshold"] == info["no_answer_threshold"]
        _ask(browser, s.url, CONTEXT, question)
        why = browser.find_element(By.ID, "why").text
        assert _visible(browser, "why") and "this server's no-answer threshold" in why
        assert _bar(why) == pytest.approx(1 - answered["threshold"], abs=5e-4)


def test_batch_mode_and_the_servers_error_message(playground_server, browser) -> None:
    from selenium.webdriver.common.by import By

    _ask(browser, playground_server.url, CONTEXT, "Who?\nWhen?\nWhere?", threshold="1", batch=True)
    rows = browser.find_elements(By.CSS_SELECTOR, "#batch-table tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == ["Who?", "When?", "Where?"]
    rows[2].click()
    assert "selected" in rows[2].get_attribute("class")
    expected = _api(playground_server.url, {"question": "Where?", "context": CONTEXT, "threshold": 1.0})
    mark = browser.find_element(By.CSS_SELECTOR, "#context-view mark")
    assert int(mark.get_attribute("data-start")) == expected["start"]
    _ask(browser, playground_server.url, "x" * 20001, "Why?")  # over max_context_chars: 413 from the server
    error = browser.find_element(By.ID, "error")
    assert (
        error.is_displayed() and "HTTP 413 context_too_large" in error.text and "limit is 20000" in error.text
    )
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "413" not in e["message"]]
    assert severe == [], severe  # no script errors, no CSP violations


def test_several_lines_without_batch_are_refused_not_glued_into_one_question(
    playground_server, browser
) -> None:
    """Four lines with Batch unchecked were once sent as one question made of all four: now the page says
    to check Batch (or keep one line) and asks nothing."""
    from selenium.webdriver.common.by import By

    _ask(browser, playground_server.url, CONTEXT, "Who?\nWhen?", threshold="1", batch=False)
    error = browser.find_element(By.ID, "error")
    assert error.is_displayed() and "check Batch" in error.text
    assert browser.find_element(By.ID, "result").get_attribute("data-done") in (None, "")


def test_static_files_types_and_security_headers(playground_server) -> None:
    for path, name in [("/", "index.html"), *((f"/playground/{n}", n) for n in FILES if n != "index.html")]:
        r = httpx.get(playground_server.url + path)
        assert r.status_code == 200 and r.headers["content-type"] == FILES[name], path
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert r.headers["x-content-type-options"] == "nosniff"
    for bad in ("/playground/../settings.py", "/playground/index.html", "/playground/%2e%2e%2fapp.py"):
        assert httpx.get(playground_server.url + bad).status_code == 404, bad
    page = httpx.get(playground_server.url + "/").text
    assert "http://" not in page and "https://" not in page  # nothing loaded from elsewhere
    for asset in ("app.js", "style.css"):
        text = httpx.get(f"{playground_server.url}/playground/{asset}").text
        assert "http://" not in text and "https://" not in text, asset


def test_the_playground_can_be_switched_off(onnx_export: Path, tmp_path: Path) -> None:
    with ServerProcess(onnx_export, tmp_path, "--playground", "false") as s:
        assert httpx.get(s.url + "/").status_code == 404
        assert httpx.get(s.url + "/playground/app.js").status_code == 404
        assert httpx.get(s.url + "/healthz").status_code == 200


def test_chromium_is_the_debian_build() -> None:
    out = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "Chromium" in out.stdout


def test_keyboard_only_and_a_narrow_screen(playground_server, browser) -> None:
    """Ctrl+Enter asks without the mouse; at 400 px wide nothing scrolls sideways; every field has a label."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(400, 900)
    try:
        browser.get(playground_server.url + "/")
        WebDriverWait(browser, 30).until(lambda d: "threshold" in d.find_element(By.ID, "model-line").text)
        browser.find_element(By.ID, "context").send_keys(CONTEXT)
        question = browser.find_element(By.ID, "question")
        question.send_keys("Who were the Normans?")
        question.send_keys(Keys.CONTROL, Keys.ENTER)
        WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "result").get_attribute("data-done"))
        overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a 400 px screen"
        unlabelled = browser.execute_script(
            "return [...document.querySelectorAll('input, textarea, select')]"
            ".filter(e => !document.querySelector(`label[for='${e.id}']`)).map(e => e.id)"
        )
        assert unlabelled == []
    finally:
        browser.set_window_size(1100, 1400)


def test_an_open_server_never_shows_the_key_field(playground_server, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(playground_server.url + "/")
    WebDriverWait(browser, 30).until(ec.text_to_be_present_in_element((By.ID, "model-line"), "threshold"))
    assert not _visible(browser, "key-row")
    assert browser.execute_script(HIDDEN_BUT_SHOWN) == []
    _ask(browser, playground_server.url, CONTEXT, "Who gave their name to Normandy?")
    assert browser.find_element(By.ID, "result").get_attribute("data-done")
    assert not _visible(browser, "key-row")
    assert browser.execute_script(HIDDEN_BUT_SHOWN) == []


def test_a_server_with_keys_asks_for_one_after_a_401_and_the_page_keeps_it_out_of_storage(
    onnx_export: Path, browser, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    key = "playground-key-0123456789"
    (tmp_path / "keys.txt").write_text(f"browser: {key}\n")
    (tmp_path / "keys.txt").chmod(0o600)
    with ServerProcess(onnx_export, tmp_path, "--api-keys-file", str(tmp_path / "keys.txt")) as s:
        wait = WebDriverWait(browser, 30)
        # The page's own first call (GET /v1/model) blocked: no 401 has come, so no key field yet.
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/v1/model"]})
        try:
            browser.get(s.url + "/")
            wait.until(ec.text_to_be_present_in_element((By.ID, "model-line"), "Could not read"))
        finally:
            browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
            browser.execute_cdp_cmd("Network.disable", {})
        assert not _visible(browser, "key-row")
        browser.find_element(By.ID, "context").send_keys(CONTEXT)
        browser.find_element(By.ID, "question").send_keys("Who gave their name to Normandy?")
        browser.find_element(By.ID, "ask").click()  # no key: 401 from /answer shows the field
        wait.until(lambda d: d.find_element(By.ID, "error").is_displayed())
        assert "401" in browser.find_element(By.ID, "error").text and _visible(browser, "key-row")
        browser.find_element(By.ID, "api-key").send_keys("wrong-key-0123456789abc")
        browser.find_element(By.ID, "ask").click()
        wait.until(lambda d: d.find_element(By.ID, "error").is_displayed())
        assert "401" in browser.find_element(By.ID, "error").text
        field = browser.find_element(By.ID, "api-key")
        field.clear()
        field.send_keys(key)
        browser.find_element(By.ID, "ask").click()
        wait.until(lambda d: d.find_element(By.ID, "result").get_attribute("data-done"))
        assert not browser.find_element(By.ID, "error").is_displayed()
        assert browser.find_element(By.ID, "answer-line").text  # answered with the key
        assert _visible(browser, "key-row")  # and the field stays
        stored = browser.execute_script(
            "return JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie + location.href"
        )
        assert key not in stored
        wait.until(
            ec.text_to_be_present_in_element((By.ID, "model-line"), "threshold")
        )  # reloaded with the key
        browser.get(s.url + "/")  # a fresh page: the 401 of /v1/model shows the field at once
        wait.until(ec.visibility_of_element_located((By.ID, "api-key")))
        assert "API key" in browser.find_element(By.ID, "model-line").text


def test_the_api_reference_at_docs_renders_with_nothing_from_the_network(playground_server, browser) -> None:
    """/docs is the HTTP API reference rendered by the server, one self-contained page: in the browser it
    shows every route and body, and it loaded no resource at all (no script, style or font from a CDN,
    so it renders with the network off); its policy forbids loading any."""
    from selenium.webdriver.common.by import By

    r = httpx.get(playground_server.url + "/docs", timeout=10)
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert "http://" not in r.text and "https://" not in r.text and "<script" not in r.text
    browser.get(playground_server.url + "/docs")
    headings = [h.text for h in browser.find_elements(By.TAG_NAME, "h2")]
    assert {"POST /answer", "POST /answer/batch", "GET /v1/model", "AnswerRequest"} <= set(headings)
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert browser.find_element(By.CSS_SELECTOR, "a[href='#answerrequest']").is_displayed()
