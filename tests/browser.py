"""Headless Chromium (Debian's chromium + chromedriver, installed by `make browser`) through
selenium, for the tests that render the HTML leaderboard."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[Any]:
    """A selenium driver of headless Chromium with a fresh profile folder (removed after)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for exe in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
        assert Path(exe).is_file(), f"{exe} missing: run `make browser` (Debian chromium)"
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1280,900",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def decoded(driver: Any, image: Any) -> bool:
    """The browser decoded this <img> (its natural width is known and positive)."""
    return bool(driver.execute_script(
        "return arguments[0].complete && arguments[0].naturalWidth > 0", image))


def page_width_problems(driver: Any) -> list[str]:
    """What is wider than the window: the page, or any table, image, figure, paragraph or
    heading (by its right edge, or content wider than itself)."""
    return driver.execute_script("""
        const out = [], w = window.innerWidth, doc = document.documentElement;
        if (doc.scrollWidth > w) out.push(`page ${doc.scrollWidth} px > ${w} px`);
        for (const el of document.querySelectorAll('table, img, figure, p, h2, h3')) {
          const r = el.getBoundingClientRect();
          if (r.right > w + 0.5 || el.scrollWidth > el.clientWidth + 1)
            out.push(`${el.tagName}.${el.className} ${Math.round(r.right)} px`);
        }
        return out;""")
