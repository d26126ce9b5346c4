"""The trajectory viewer in a real headless Chromium (Debian's chromium + chromium-driver, driven by selenium)."""

from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest
import uvicorn

from orchard.env.runner import free_port
from orchard.view import create_app

from tests.eval.runs import make_run

CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("run"), {"six-1": [True, False, "sandbox"], "toolz-2": [False, True]},
                   harness="minimal")
    app = create_app(run, decode=lambda ids: " ".join(f"t{i}" for i in ids))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.config.port}/"
    for _ in range(200):
        try:
            httpx.get(url + "api/facets", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser():
    if not (CHROMEDRIVER and CHROMIUM):
        pytest.fail("chromium and chromium-driver are required (make install puts them in via APT_PKGS)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def rows(browser):
    from selenium.webdriver.common.by import By
    return browser.find_elements(By.CSS_SELECTOR, "#rollouts tbody tr")


def row_ids(browser) -> list[str]:
    """The listed rollouts, read in one go (the list is re-rendered while filters settle)."""
    return browser.execute_script("return [...document.querySelectorAll('#rollouts tbody tr')].map(r => r.dataset.id)")


def test_api_filters_and_errors(viewer):
    assert len(httpx.get(viewer + "api/rollouts").json()) == 5
    assert [r["rollout_id"] for r in httpx.get(viewer + "api/rollouts", params={"reward": "infra"}).json()] == ["six-1#2"]
    assert len(httpx.get(viewer + "api/rollouts", params={"failure": "none", "task": "toolz-2"}).json()) == 2
    assert httpx.get(viewer + "api/rollouts", params={"reward": "maybe"}).status_code == 400
    assert httpx.get(viewer + "api/rollouts/nope%230").status_code == 404


def test_page_lists_filters_and_shows_a_trajectory(viewer, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(viewer)
    wait_for(lambda: len(row_ids(browser)) == 5)
    Select(browser.find_element(By.ID, "filter-task")).select_by_visible_text("six-1")
    wait_for(lambda: len(row_ids(browser)) == 3)
    Select(browser.find_element(By.ID, "filter-reward")).select_by_visible_text("resolved")
    wait_for(lambda: row_ids(browser) == ["six-1#0"])
    rows(browser)[0].click()
    turns = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#turns .turn"))
    assert [t.find_element(By.TAG_NAME, "h4").text for t in turns] == ["USER", "ASSISTANT (THOUGHT + ACTION)", "OBSERVATION"]
    assert turns[1].find_element(By.CLASS_NAME, "call").text == "bash\nls"      # the command itself, not its JSON
    assert "Let me look." in turns[1].text
    assert [s.text for s in browser.find_elements(By.CSS_SELECTOR, "#mask .mask-1")] == ["t3 t4", "t6"]
    assert "+a <= b" in browser.find_element(By.ID, "diff").text
    assert browser.find_element(By.ID, "reward").text == "1 resolved"
    assert "grade 1.50 s, proxy 0.25 s, engine 0.25 s" in browser.find_element(By.ID, "timings").text
    assert "#0 2+2 (tool_calls)" in browser.find_element(By.ID, "tokens").text


def test_infrastructure_failures_are_marked(viewer, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(viewer)
    wait_for(lambda: len(row_ids(browser)) == 5)
    Select(browser.find_element(By.ID, "filter-failure")).select_by_visible_text("sandbox")
    wait_for(lambda: len(row_ids(browser)) == 1)
    assert "infra: sandbox" in rows(browser)[0].text


def test_a_link_with_a_rollout_in_its_fragment_opens_it(viewer, browser):
    from selenium.webdriver.common.by import By

    browser.get(viewer + "#six-1%230")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#detail h2"))
    assert browser.find_element(By.CSS_SELECTOR, "#detail h2").text == "six-1#0"
    assert browser.find_element(By.ID, "reward").text == "1 resolved"
    rows(browser)[-1].click()                      # choosing another row puts it in the address
    wait_for(lambda: browser.execute_script("return location.hash") != "#six-1%230")
    other = browser.execute_script("return decodeURIComponent(location.hash.slice(1))")
    wait_for(lambda: browser.find_element(By.CSS_SELECTOR, "#detail h2").text == other)
