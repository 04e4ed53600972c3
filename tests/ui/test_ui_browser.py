"""The dashboard end to end in a real headless browser (DESIGN.md §10): Mosquitto, the live coordinator
with its dashboard (the in-process equivalent of ``quietfleet coordinator --ui``), two CPython agents,
and Debian's Chromium driven by Selenium through Debian's chromedriver (no browser download). The page
must draw every query's band, follow the answers as they change, and show a device going offline when
its agent dies (its Last Will)."""
import os
import re
import shutil
import signal
import time

import pytest

from backend.host import Host
from backend.live.coordinator import LiveCoordinator
from backend.ui.providers import CoordinatorTotals
from backend.ui.server import Dashboard
from edge.core import topics
from helpers import client, close, connected, start_cpython_agent

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--window-size=1280,1400"]
F = "t"
QUERIES = {"total": {"kind": "sum", "sources": ["a0", "b0"], "precision": 2.0},
           "mean": {"kind": "avg", "sources": ["a0", "b0"], "precision": 1.0}}
NUMBER = re.compile(r"^-?\d+(\.\d+)?(e[-+]?\d+)?$")


def chromium(tmp_path):
    """Headless Chromium with a fresh profile, or skip when this machine has none (scripts/setup.sh installs it)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            pytest.skip("%s not installed (scripts/setup.sh installs chromium and chromium-driver)" % path)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS + ["--user-data-dir=%s" % (tmp_path / "chromium-profile")]:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")))


def wait(driver, pred, timeout, what):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait
    try:        # (a re-render may replace an element between finding and reading it: poll again)
        return WebDriverWait(driver, timeout, poll_frequency=0.1,
                             ignored_exceptions=(StaleElementReferenceException,)).until(lambda d: pred(d))
    except Exception as e:
        raise AssertionError("page: %s not seen within %.0fs (%s)" % (what, timeout, type(e).__name__))


def text(driver, css):
    from selenium.webdriver.common.by import By
    els = driver.find_elements(By.CSS_SELECTOR, css)
    return els[0].text if els else None


def drawn(driver, qid):
    """The query's row shows numbers and its chart has a canvas with at least two answers."""
    return driver.execute_script("""
        const c = document.querySelector('.query[data-id="' + arguments[0] + '"]');
        if (!c) return null;
        const canvas = c.querySelector('.chart canvas');
        return {lo: c.querySelector('.q-lo').textContent, hi: c.querySelector('.q-hi').textContent,
                t: c.querySelector('.q-time').dataset.t, points: Number(c.dataset.points),
                canvas: !!canvas && canvas.width > 0 && canvas.height > 0,
                degraded: c.classList.contains('degraded'), guarantee: c.querySelector('.badge').textContent};
    """, qid)


def status(driver, dev):
    return text(driver, '#devices tr[data-id="%s"] td.d-status' % dev)


def test_dashboard_in_chromium(broker, tmp_path, monkeypatch):
    monkeypatch.setenv("SE_OFFLINE", "true")        # Selenium Manager must never try to download a browser
    t_start = time.monotonic()
    driver = chromium(tmp_path)
    # a 1 s heartbeat, as the live drivers run one (30 s there): a dead agent's answers degrade within seconds
    host = Host(protocol="deadband", period=1.0, latency=0.2, beat=1.0)
    live = LiveCoordinator(host, F, broker.host, broker.port, broker.credentials("backend")[1])
    dash = Dashboard(F, broker.host, broker.port, broker.credentials("backend")[1],
                     provider=CoordinatorTotals(live)).start()
    thread = live.start_thread()
    agents, user = {}, None
    try:
        for dev, src, seed in (("A", "a0", 3), ("B", "b0", 4)):
            agents[dev] = start_cpython_agent(str(tmp_path), broker, dev, [(src, {"kind": "walk", "step": 0.5,
                                                                                    "seed": seed})], width=1.0)
        user = client(broker, "backend")
        assert connected(user)[0]
        import json
        for qid, spec in QUERIES.items():             # registered as a user does: retained specs
            user.publish(topics.query(F, qid, "spec"), json.dumps(spec), qos=1, retain=True).wait_for_publish(2)
        driver.get(dash.url)
        wait(driver, lambda d: text(d, "#conn") == "live", 10, "the live event stream")
        # every query's band is drawn and its row shows numbers
        for qid in QUERIES:
            wait(driver, lambda d: (lambda s: s and s["canvas"] and s["points"] >= 2 and NUMBER.match(s["lo"])
                                    and NUMBER.match(s["hi"]))(drawn(d, qid)), 30, "the band of %s" % qid)
        first = drawn(driver, "total")
        assert float(first["lo"]) <= float(first["hi"]) and first["guarantee"] == "interval"
        assert "SUM" in text(driver, '.query[data-id="total"] .kind')
        # ... and it follows the answers
        later = wait(driver, lambda d: (lambda s: s if s["t"] != first["t"] and s["points"] > first["points"]
                                        else None)(drawn(d, "total")), 15, "the band of total move on")
        assert float(later["t"]) > float(first["t"])
        # both devices online in the table, with their sources, then A's agent dies: its Last Will
        wait(driver, lambda d: status(d, "A") == "online" and status(d, "B") == "online", 15, "A and B online")
        assert text(driver, '#devices tr[data-id="A"] td.d-sources') == "a0"
        assert text(driver, "#t-messages") not in (None, "–")
        agents["A"].send_signal(signal.SIGKILL)
        agents["A"].wait(5)
        wait(driver, lambda d: status(d, "A") == "offline", 15, "A offline")
        assert status(driver, "B") == "online"
        wait(driver, lambda d: drawn(d, "total")["degraded"], 15, "total degraded while A is gone")
        driver.save_screenshot(str(tmp_path / "dashboard.png"))
        if os.environ.get("QF_UI_SCREENSHOT"):
            shutil.copy(tmp_path / "dashboard.png", os.environ["QF_UI_SCREENSHOT"])
        severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not severe, severe
    finally:
        driver.quit()
        for p in agents.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in agents.values():
            try:
                p.communicate(timeout=5)
            except Exception:
                p.kill()
        if user is not None:
            close(user)
        dash.stop()
        live.stop()
        thread.join(5)
    print("\n[dashboard] browser test took %.1f s" % (time.monotonic() - t_start))
