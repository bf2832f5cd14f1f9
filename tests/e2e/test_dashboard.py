"""The dashboard in headless Chromium (Debian's chromium and chromium-driver, driven by Selenium):
it asks for a key, then shows functions, the simulated GPU with its instances' granted and used
shares over time, memory slices, scaling decisions and logs, and follows changes live; with many
functions it lists the busy ones first and filters by name."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from dilu.db import repo
from dilu.db.engine import make_engine, make_session_factory, migrate
from dilu.spec import spec_from_dict, spec_to_dict
from tests.conftest import FIXTURE_FUNCTIONS, ROOT
from tests.shim_harness import build_shim

EXAMPLE = ROOT / "examples" / "synthetic-gpu"
ADMIN = "dashboard-admin-key-0123456789"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
TRAINING_COLOUR = (0x33, 0x66, 0xCC)   # the first colour of the page's palette: the first function drawn


@pytest.fixture
def browser():
    if not (CHROMIUM and CHROMEDRIVER):    # as the docker tests without an engine: said, not failed
        missing = " and ".join(name for name, found in (("chromium", CHROMIUM), ("chromium-driver", CHROMEDRIVER))
                               if not found)
        pytest.skip(f"the dashboard tests drive Chromium: {missing} not installed (Debian: apt-get install "
                    "chromium chromium-driver; .ci/run installs them)")
    options = Options()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1500,1400", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def _wait(driver, condition, what: str, timeout: float = 60):
    # The page redraws every second: an element found just before a redraw goes stale; look again.
    return WebDriverWait(driver, timeout, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
                         ).until(lambda d: condition(d), message=what)


def _cell(driver, function: str, column: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, f'tr[data-function="{function}"] td.{column}').text


def _coloured_pixels(path: Path, colour: tuple[int, int, int]) -> int:
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.int16)
    return int((np.abs(pixels - np.array(colour, dtype=np.int16)) <= 12).all(axis=-1).sum())


def test_dashboard_shows_the_platform_live(start_platform, browser, tmp_path: Path) -> None:
    build_shim()
    platform = start_platform(env={"DILU_FAKE_GPUS": "1", "DILU_GPUS": "none", "DILU_ADMIN_KEY": ADMIN,
                                   "DILU_API_KEY": ADMIN})
    platform.http.headers["authorization"] = f"Bearer {ADMIN}"
    for spec in ("training.yaml", "latency.yaml"):
        deployed = platform.cli("deploy", str(EXAMPLE / spec))
        assert deployed.returncode == 0, deployed.stderr
    platform.wait_ready("synthetic-training")
    platform.wait_ready("synthetic-latency")

    page = httpx.get(f"{platform.url}/dashboard")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    assert httpx.get(f"{platform.url}/v1/dashboard").status_code == 401   # the data needs a key

    browser.get(f"{platform.url}/dashboard")
    form = _wait(browser, lambda d: d.find_element(By.ID, "key-form").is_displayed()
                 and d.find_element(By.ID, "key-form"), "the page to ask for a key")
    assert "needs an API key" in browser.find_element(By.ID, "key-error").text
    form.find_element(By.ID, "key").send_keys(ADMIN)
    form.find_element(By.TAG_NAME, "button").click()

    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#functions tr[data-function]")) == 2,
          "both functions in the table")
    assert "ready" in _cell(browser, "synthetic-training", "instances")
    gpu = '.device[data-worker$="-fakegpu0"]'     # beside the CPU worker, which holds nothing here
    assert "fake" in browser.find_element(By.CSS_SELECTOR, f"{gpu} h3").text.lower()
    assert "memory slices: 512.0 MiB" in browser.find_element(By.CSS_SELECTOR, gpu).text

    # Live: requests show up without a reload...
    before = int(_cell(browser, "synthetic-latency", "requests"))
    for _ in range(5):
        assert platform.invoke("synthetic-latency", {}).status_code == 200
    _wait(browser, lambda d: int(_cell(d, "synthetic-latency", "requests")) >= before + 5, "the request count to rise")
    _wait(browser, lambda d: _cell(d, "synthetic-latency", "p99").split(" /")[0] not in ("–", ""), "a p99")
    # The vertical-scaling picture: granted and used lines of both instances (an instance appears
    # once its first kernel has registered it with the token manager).
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "path[data-series$=':granted']")) == 2
          and len(d.find_elements(By.CSS_SELECTOR, "path[data-series$=':used']")) == 2, "share lines of both instances")

    # ...and so does a vertical resize: the training instance's granted share drops to its new limit.
    training = platform.instances("synthetic-training")[0]["id"]

    def granted(d: object) -> float:
        return float(d.find_element(By.CSS_SELECTOR, f'tr[data-instance="{training}"]')
                     .get_attribute("data-granted") or "nan")

    _wait(browser, lambda d: granted(d) > 0.3, "the training instance's share before the resize")
    assert platform.cli("scale", "synthetic-training", "--sm-request", "0.1", "--sm-limit", "0.2").returncode == 0
    _wait(browser, lambda d: granted(d) <= 0.2 + 1e-6, "the resize to show")

    # A streaming function's time to first chunk and between chunks (it fits beside the resized one).
    counter = FIXTURE_FUNCTIONS / "counter_stream" / "model.yaml"   # gpu: true: on the (fake) GPU, beside the rest
    small = counter.read_text().replace("gpu: false", "gpu: true").replace("sm_request: 0.5, sm_limit: 1.0",
                                                                             "sm_request: 0.05, sm_limit: 0.05")
    assert platform.deploy_file(counter, small).status_code == 201
    platform.wait_ready("counter")
    assert _cell(browser, "synthetic-latency", "streams") == "–"
    with platform.http.stream("POST", "/v1/functions/counter/invoke", json={"to": 3},
                              headers={"accept": "text/event-stream"}) as reply:
        assert len([line for line in reply.iter_lines() if line]) == 4
    _wait(browser, lambda d: _cell(d, "counter", "streams").endswith(" ms"), "the stream timings")

    _wait(browser, lambda d: any("synthetic-training" in row.text
                                 for row in d.find_elements(By.CSS_SELECTOR, "#events tbody tr")), "scaling decisions")
    # Times read as the CLI's and the API's do: UTC, 24 hours.
    first_event = browser.find_element(By.CSS_SELECTOR, "#events tbody tr td").text
    assert re.fullmatch(r"\d\d:\d\d:\d\d UTC", first_event), first_event
    assert browser.find_element(By.ID, "updated").text.endswith(" UTC")
    # A function that failed says why in its own row.
    assert platform.cli("deploy", str(FIXTURE_FUNCTIONS / "bad_load" / "model.yaml")).returncode != 0
    _wait(browser, lambda d: "weights file is corrupt" in d.find_element(
        By.CSS_SELECTOR, 'tr[data-function="bad-load"] .reason').text, "the failed function's reason in its row")
    Select(browser.find_element(By.ID, "log-function")).select_by_value("synthetic-training")
    _wait(browser, lambda d: "ready" in d.find_element(By.ID, "logs").text, "the instance log")

    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    with Image.open(shot) as image:
        assert image.size[0] >= 1400
    # The chart is drawn: the first function's colour covers a visible stretch of the picture.
    assert _coloured_pixels(shot, TRAINING_COLOUR) > 300
    if os.environ.get("DILU_SCREENSHOT_TO"):   # `DILU_SCREENSHOT_TO=docs/dashboard.png pytest ...`
        shutil.copy(shot, os.environ["DILU_SCREENSHOT_TO"])


def test_with_many_functions_the_page_lists_the_busy_ones_first_and_filters_by_name(
        start_platform, browser, tmp_path: Path) -> None:
    """150 idle functions (rows of a catalogue the platform starts with) and one called: the page
    lists 100, the called one first, says how many there are, and a filter finds the others."""
    home = tmp_path / "home"      # where start_platform keeps its state
    home.mkdir()
    migrate(f"sqlite:///{home / 'dilu.db'}")
    engine = make_engine(f"sqlite:///{home / 'dilu.db'}")
    echo = ROOT / "examples" / "echo"
    with make_session_factory(engine)() as session:
        idle = {"handler": "handler:Echo", "resources": {"memory": "64Mi", "gpu": False, "sm_request": 0.05,
                                                         "sm_limit": 0.05}}
        for index in range(150):
            repo.upsert_function(session=session, spec=spec_to_dict(spec_from_dict({"name": f"idle-{index:03d}",
                                                                                     **idle})),
                                 source_dir=str(echo))
            repo.set_function_status(session=session, name=f"idle-{index:03d}", version=1, status="ready")
    engine.dispose()
    platform = start_platform()
    assert platform.deploy_file(echo / "model.yaml", (echo / "model.yaml").read_text().replace(
        "name: echo", "name: zz-called")).status_code == 201
    assert platform.invoke("zz-called", {"x": 1}).status_code == 200
    listed = platform.http.get("/v1/dashboard", params={"limit": 3}).json()
    assert [f["name"] for f in listed["functions"]] == ["zz-called", "idle-000", "idle-001"]
    assert listed["functions_total"] == 151

    browser.get(f"{platform.url}/dashboard")
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#functions tr[data-function]")) == 100,
          "the first 100 functions")
    rows = browser.find_elements(By.CSS_SELECTOR, "#functions tr[data-function]")
    assert rows[0].get_attribute("data-function") == "zz-called"
    assert "showing 100 of 151" in browser.find_element(By.ID, "functions-shown").text
    assert "151 functions" in browser.find_element(By.ID, "summary").text
    browser.find_element(By.ID, "function-filter").send_keys("IDLE-14")     # typed as a user might
    _wait(browser, lambda d: [r.get_attribute("data-function") for r in d.find_elements(
        By.CSS_SELECTOR, "#functions tr[data-function]")] == [f"idle-14{digit}" for digit in range(10)],
          "the ten functions whose name holds idle-14")
    assert 'holds "idle-14"' in browser.find_element(By.ID, "functions-shown").text
    for bad in ({"match": "%"}, {"match": "a b"}, {"limit": 0}, {"limit": 5000}):
        assert platform.http.get("/v1/dashboard", params=bad).status_code == 422, bad
    # "_" is a name's own character, matched as itself (LIKE would read it as any character).
    literal = platform.http.get("/v1/dashboard", params={"match": "e_1"})
    assert literal.status_code == 200 and literal.json()["functions"] == [], literal.text
