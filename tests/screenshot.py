"""Screenshots of web pages and local HTML files (the Snakemake report) with headless Chromium.

``chromium_path()`` finds the browser; where there is none and the tests run as root on a
Debian-like system, it installs the ``chromium`` package once (``apt-get update`` first; about a
minute on a 2-core machine with a fast mirror). ``screenshot()`` runs::

    chromium --headless --no-sandbox --disable-gpu --screenshot=PNG --window-size=W,H \\
             --virtual-time-budget=MS URL

The virtual-time budget lets the page's scripts (the report is a React application) run and
its timers fire before the picture is taken.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from html import unescape
from pathlib import Path

import numpy as np
from PIL import Image

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_TIMEOUT_S = 900
SCREENSHOT_TIMEOUT_S = 120


def _find() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@functools.cache
def _install_chromium() -> bool:
    """``apt-get update && apt-get install -y chromium``, tried once per process; True if it worked."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return False
        if proc.returncode != 0:
            return False
    return True


def chromium_path(install: bool = True) -> str | None:
    """The Chromium (or Chrome) executable; installed with apt-get if absent and we are root
    (``install``); None where there is none and it cannot be installed."""
    found = _find()
    if found or not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    return _find() if _install_chromium() else None


def screenshot(url_or_path: str | os.PathLike[str], png: str | os.PathLike[str], width: int = 1600,
               height: int = 1000, wait_ms: int = 3000, dom: str | os.PathLike[str] | None = None) -> Path:
    """Take a ``width`` x ``height`` screenshot of a URL or a local file into ``png``; the page
    runs for ``wait_ms`` ms of virtual time first. ``dom``: also write the page's DOM there, as
    the scripts left it (the same browser run). RuntimeError if there is no browser or it fails."""
    browser = chromium_path()
    if browser is None:
        raise RuntimeError("no chromium / chrome executable, and it could not be installed")
    target = str(url_or_path)
    url = target if "://" in target else Path(target).resolve().as_uri()
    out = Path(png).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--hide-scrollbars", "--no-first-run", f"--user-data-dir={profile}", f"--screenshot={out}",
               *(["--dump-dom"] if dom is not None else []), f"--window-size={width},{height}",
               f"--virtual-time-budget={wait_ms}", url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SCREENSHOT_TIMEOUT_S)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if dom is not None:
        Path(dom).write_text(proc.stdout, encoding="utf-8")
    return out


def visible_text(html: str) -> str:
    """The text of a page's DOM without its scripts, styles and tags (what a reader can see,
    give or take hidden elements), whitespace collapsed."""
    html = re.sub(r"<(script|style)\b[^>]*>.*?</\1>", " ", html, flags=re.S | re.I)
    text = re.sub(r"<[^>]+>", " ", html)
    return " ".join(unescape(text).split())


def colours(png: str | os.PathLike[str]) -> int:
    """How many distinct colours the image has (1: blank)."""
    with Image.open(png) as img:
        rgb = np.asarray(img.convert("RGB"))
    return len(np.unique(rgb.reshape(-1, 3), axis=0))


def non_trivial(png: str | os.PathLike[str], min_bytes: int = 10_000, min_colours: int = 16) -> bool:
    """The screenshot shows something: not tiny, and not (nearly) one colour."""
    path = Path(png)
    return path.exists() and path.stat().st_size >= min_bytes and colours(path) >= min_colours
