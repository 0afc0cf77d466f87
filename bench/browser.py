"""Headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven by Selenium: the playground's
end-to-end tests and its README screenshot use the same browser with the same flags."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# No sandbox (CI runs as root), no GPU, nothing fetched in the background: a quiet, offline browser.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-dev-shm-usage",
)
INSTALL_HINT = "apt-get install chromium chromium-driver (and pip install selenium)"


@contextmanager
def headless_chromium(width: int = 1100, height: int = 1400) -> Iterator[Any]:
    """A Selenium Chrome driver on a fresh profile directory, removed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        raise FileNotFoundError(f"no {CHROMIUM} or {CHROMEDRIVER}: {INSTALL_HINT}")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="xlnetqa-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
