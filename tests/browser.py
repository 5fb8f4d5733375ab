"""Headless Chromium for the tests that open a page (the HTML report, the wasm example): where it is,
and the flags that keep it from touching the network or a profile outside the test's folder."""

from __future__ import annotations

import shutil

HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]

NOT_INSTALLED = "no Chromium installed (Debian: apt-get install chromium)"


def chromium() -> str | None:
    """The first Chromium-family browser on PATH, or None."""
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "chrome")) if p),
                None)
