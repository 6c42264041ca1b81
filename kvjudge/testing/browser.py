"""A real headless Chromium for tests, benchmarks and screenshots: the system's browser, driven by Selenium.

Chromium and its driver come from the system's packages (Debian: ``apt-get install chromium chromium-driver``;
``scripts/ensure-chromium`` installs them where they are missing). Both paths are given to Selenium explicitly,
so selenium-manager never looks for, let alone downloads, a browser or a driver. Chromium runs with a fresh
profile and with every background connection off (this machine's network is closed, and a report must not need
it anyway). Console messages, CSP violations included, are kept at every level (``goog:loggingPrefs``).

``KVJUDGE_CHROMIUM`` / ``KVJUDGE_CHROMEDRIVER`` name other binaries. No browser is an error, never a skip.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")


class NoBrowser(RuntimeError):
    """No Chromium or chromedriver here: the browser tests cannot run (they fail, they are never skipped)."""


def binaries() -> tuple[str, str]:
    """The Chromium and chromedriver to use; NoBrowser, saying how to install them, when either is missing."""
    chromium = os.environ.get("KVJUDGE_CHROMIUM", CHROMIUM)
    driver = os.environ.get("KVJUDGE_CHROMEDRIVER", CHROMEDRIVER)
    missing = [path for path in (chromium, driver) if not (Path(path).is_file() and os.access(path, os.X_OK))]
    if missing:
        raise NoBrowser(f"{', '.join(missing)} not found: run scripts/ensure-chromium (apt-get install chromium "
                        f"chromium-driver), or point KVJUDGE_CHROMIUM and KVJUDGE_CHROMEDRIVER at a Chromium and "
                        f"its chromedriver")
    return chromium, driver


@contextmanager
def chromium() -> Iterator[Any]:
    """A Selenium WebDriver on a headless Chromium with a fresh profile, quit (and its profile removed) after."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = binaries()
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager, were it ever asked, must not go online
    profile = tempfile.mkdtemp(prefix="kvjudge-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    session = None
    try:
        session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
        yield session
    finally:
        if session is not None:
            session.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console(session: Any) -> list[dict[str, Any]]:
    """The browser's console messages since the last call (level, message, source)."""
    return list(session.get_log("browser"))


def open_page(session: Any, path: Path) -> list[dict[str, Any]]:
    """Load a local page and wait for it; the console messages it left."""
    session.get(Path(path).resolve().as_uri())
    session.execute_script("return document.readyState")
    return console(session)


def screenshot(session: Any, path: Path, *, full_page: bool = True) -> Path:
    """A PNG of the current page (its whole height when ``full_page``) for people to look at."""
    if full_page:
        height = session.execute_script("return document.documentElement.scrollHeight")
        width = session.execute_script("return document.documentElement.scrollWidth")
        session.set_window_size(max(1400, width), min(max(600, height + 40), 16000))
    path.parent.mkdir(parents=True, exist_ok=True)
    session.save_screenshot(str(path))
    return path
