"""Regenerates docs/dashboard.png: `dilu up` on a simulated GPU, a batch function beside a latency
function that gets bursts of requests (the token manager squeezes the batch work during each
burst and gives its share back after), then a screenshot of the dashboard in headless Chromium.

    python scripts/dashboard-screenshot.py [docs/dashboard.png]

Needs the shim built (`make -C shim`) and Debian's chromium and chromium-driver.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from tests.platform import Platform


def main() -> None:
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "dashboard.png")
    home = Path(tempfile.mkdtemp(prefix="dilu-shot-")) / "home"
    platform = Platform(home, env={"DILU_FAKE_GPUS": "1", "DILU_GPUS": "none", "DILU_LOCAL_ROOTS": str(ROOT)})
    try:
        for spec in ("training.yaml", "latency.yaml"):
            platform.cli("deploy", "--local", str(ROOT / "examples" / "synthetic-gpu" / spec))
        for name in ("synthetic-training", "synthetic-latency"):
            platform.wait_ready(name)
        stop = threading.Event()

        def bursts() -> None:
            while not stop.is_set():
                until = time.monotonic() + 6
                while time.monotonic() < until and not stop.is_set():
                    platform.invoke("synthetic-latency", {})
                stop.wait(6)   # quiet: the batch function gets its share back

        sender = threading.Thread(target=bursts)
        sender.start()
        options = Options()
        options.binary_location = "/usr/bin/chromium"
        for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1500,1250"):
            options.add_argument(argument)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            driver.get(f"{platform.url}/dashboard")
            time.sleep(float(os.environ.get("SHOT_AFTER_S", "40")))   # history to fill
            driver.save_screenshot(str(target))
        finally:
            stop.set()
            sender.join()
            driver.quit()
    finally:
        platform.close()
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
