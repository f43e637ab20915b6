"""A real headless Chromium driven by selenium (Debian's ``chromium`` and
``chromedriver``; ``tools/install-system-deps.sh`` installs them), for the tests
of the memory page, and where such tests leave their artifacts (screenshots).

Tests skip, saying why, only when the browser or its driver is missing. The
flags suit CI running as root in a container (``--no-sandbox``, no
``/dev/shm``). No proxy from the environment sits between the browser and the
loopback servers the tests start, and selenium never downloads anything: the
system's chromedriver is named explicitly.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
              "ALL_PROXY")
WAIT_S = 60.0  # the longest a test waits for the page (WebDriverWait, not a sleep)


def artifacts_dir() -> Path:
    """Where tests leave artifacts: ``$REVERIE_TEST_ARTIFACTS``, else
    ``test-artifacts/`` under the repository root (ignored by git)."""
    where = Path(os.environ.get("REVERIE_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    where.mkdir(parents=True, exist_ok=True)
    return where


def find_browser() -> tuple[str, str] | None:
    """(browser, chromedriver) paths, or None when either is missing."""
    browser = next((found for name in BROWSERS if (found := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def start_chromium(width: int = 1280, height: int = 1000) -> Any:
    """A new headless Chromium session (a selenium WebDriver); skips the test
    when Chromium or chromedriver is not installed."""
    found = find_browser()
    if found is None:
        pytest.skip("headless Chromium and chromedriver are needed for the browser tests "
                    "(Debian: apt-get install chromium chromium-driver, or "
                    "tools/install-system-deps.sh)")
    browser, driver_path = found
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                 "--disable-extensions", "--no-proxy-server", "--lang=en-US",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=driver_path)
    with pytest.MonkeyPatch.context() as mp:  # selenium's own client to chromedriver
        for name in PROXY_VARS:
            mp.delenv(name, raising=False)
        mp.setenv("SE_OFFLINE", "true")  # Selenium Manager: never fetch a browser or driver
        driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(WAIT_S)
    return driver


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One headless Chromium for a test module (cookies and all: tests that need a
    clean browser delete its cookies first)."""
    driver = start_chromium()
    try:
        yield driver
    finally:
        driver.quit()
