"""Load a page in headless Chromium over the DevTools protocol; collect its errors and a screenshot.

Why the protocol and not ``chromium --screenshot --enable-logging=stderr``: stderr logging shows
console messages without their level and says nothing about images that fail to load, so it
cannot tell a broken report from a good one. Here Chromium is driven over
``--remote-debugging-pipe`` (JSON messages separated by NUL bytes on file descriptors 3 and 4; no
network port, no extra package) and every error the page produces is collected:
``Runtime.exceptionThrown`` (uncaught exceptions), ``Runtime.consoleAPICalled`` of type error
or assert, ``Log.entryAdded`` at level error (e.g. "Failed to load resource") and
``Network.loadingFailed`` (any request that failed, such as a missing image).
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The first Chromium-like binary on PATH, or None."""
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageLoad:
    """What loading a page gave: the screenshot PNG bytes and every error seen."""

    screenshot: bytes
    errors: list[str] = field(default_factory=list)


class DevToolsPipe:
    """A minimal DevTools-protocol client over Chromium's ``--remote-debugging-pipe``."""

    def __init__(self, binary: str, width: int, height: int, timeout: float) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="nsacdrive-chromium-")
        to_chrome_read, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_write = os.pipe()

        def wire_pipes() -> None:  # Chromium reads commands on fd 3 and writes replies on fd 4
            # Copies first, so that moving one onto 3 or 4 cannot overwrite the other's end; the copies
            # are inheritable by exec only after set_inheritable (Python creates fds non-inheritable).
            read, write = os.dup(to_chrome_read), os.dup(from_chrome_write)
            os.dup2(read, 3)
            os.dup2(write, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.process = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire_pipes, close_fds=False)
        os.close(to_chrome_read)
        os.close(from_chrome_write)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and wait for its reply (events that arrive meanwhile are kept)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"DevTools {method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, deadline: float) -> None:
        """Read events until one named ``method`` arrives (or raise TimeoutError at ``deadline``)."""
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._receive(deadline))

    def drain(self, seconds: float) -> None:
        """Keep reading events for ``seconds`` (late errors)."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._receive(deadline))
        except TimeoutError:
            pass

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError("no DevTools message from Chromium in time")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed the DevTools pipe (exit code {self.process.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        shutil.rmtree(self.profile, ignore_errors=True)


def load_page(binary: str, url: str, width: int = 1280, height: int = 2000, timeout: float = 60.0) -> PageLoad:
    """Open ``url`` in a fresh headless Chromium, wait for the load event, return screenshot and errors."""
    browser = DevToolsPipe(binary, width, height, timeout)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        browser.send("Page.navigate", {"url": url}, session=session)
        browser.wait_for("Page.loadEventFired", time.monotonic() + timeout)
        browser.drain(0.5)
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)
        return PageLoad(base64.b64decode(shot["data"]), page_errors(browser.events))
    finally:
        browser.close()


def page_errors(events: list[dict]) -> list[str]:
    """Human-readable errors among DevTools events (see the module docstring for which count)."""
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            errors.append(f"uncaught: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append("console.error: " + " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.loadingFailed":
            errors.append(f"request failed: {params.get('errorText')}")
    return errors


def page_url(path: Path) -> str:
    return Path(path).resolve().as_uri()
