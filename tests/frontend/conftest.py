"""Browser fixtures: Debian's Chromium driven by Playwright (its bundled driver; no browser download).

The dashboard must be built (`make frontend`, which `make test` runs first); without `frontend/dist`
or `/usr/bin/chromium` these tests skip and say why.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.dashboard import DIST
from tests.conftest import ARTIFACTS

CHROMIUM = Path("/usr/bin/chromium")
AXE = DIST.parent / "node_modules" / "axe-core" / "axe.min.js"  # a devDependency of the dashboard
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = ARTIFACTS / "screenshots"
VIEWPORT = {"width": 1366, "height": 768}  # a common laptop screen


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not (DIST / "index.html").is_file():
        pytest.skip("frontend/dist is not built: run `make frontend` (make test does)")
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium: apt-get install chromium (.ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]' installs playwright")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Console:
    """Console errors and uncaught exceptions of one page; network errors a test provokes on purpose
    (an expected 404 or 422) are allowed explicitly by status."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.allowed_statuses: set[int] = set()

    def record(self, message) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def unexpected(self) -> list[str]:
        allowed = [f"the server responded with a status of {s} " for s in self.allowed_statuses]
        network = [e for e in self.errors if e.startswith("Failed to load resource")]
        expected = [e for e in network if any(a in e for a in allowed)]
        return [e for e in self.errors if e not in expected]


@pytest.fixture
def page(browser, request: pytest.FixtureRequest):
    """A fresh context (empty session storage) and page; asserts no console errors at the end."""
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(20_000)
    console = Console()
    page.on("console", console.record)
    page.on("pageerror", lambda error: console.errors.append(f"uncaught: {error}"))
    page.console = console
    yield page
    context.close()
    assert console.unexpected() == [], f"console errors in {request.node.name}"


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def audit(page, name: str) -> None:
    """Run axe-core's WCAG 2 A/AA rules on the page as it is now; serious or critical findings fail."""
    assert AXE.is_file(), f"{AXE} missing: run `make frontend` (it installs the dashboard's devDependencies)"
    page.add_script_tag(path=str(AXE))
    result = page.evaluate(
        """async () => (await axe.run(document, {runOnly: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']}))
            .violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                   nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 5)}))"""
    )
    bad = [v for v in result if v["impact"] in ("serious", "critical")]
    assert bad == [], f"accessibility violations on {name}: {bad}"


def overflow(page, selector: str) -> dict:
    """How far the element reaches past the box it sits in, and the page past the window (px, 0: it fits)."""
    return page.evaluate(
        """(selector) => {
            const el = document.querySelector(selector);
            return {
                element: Math.max(0, Math.ceil(el.getBoundingClientRect().width) - el.parentElement.clientWidth),
                page: Math.max(0, document.documentElement.scrollWidth - window.innerWidth),
            };
        }""",
        selector,
    )


def sign_in(page, base_url: str, key: str, path: str = "/jobs") -> None:
    page.goto(f"{base_url}{path}")
    page.wait_for_url("**/signin**")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"**{path}")


@pytest.fixture(scope="session", autouse=True)
def _clean_screenshots() -> None:
    shutil.rmtree(SCREENSHOTS, ignore_errors=True)
