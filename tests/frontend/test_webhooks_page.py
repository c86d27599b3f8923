"""The webhooks page in Chromium: a refused target shows its error beside the URL field; a real
local receiver gets a signed test ping, whose delivery appears in the log and can be replayed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.sync_api import expect

from tests.conftest import Service
from tests.frontend.conftest import audit, screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("service", ["sqlite"], indirect=True)]


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict]]]:
    """An HTTP receiver on 127.0.0.1 (the test settings allow it) that answers 204 and records headers."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            received.append(dict(self.headers))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", received
    finally:
        server.shutdown()
        server.server_close()


def test_add_endpoint_ping_and_replay(page, service: Service, receiver: tuple[str, list[dict]]):
    url, received = receiver
    page.console.allowed_statuses.add(422)  # the refused private address
    sign_in(page, service.url, service.new_key(), "/webhooks")

    url_input = page.get_by_label("URL", exact=True)
    url_input.fill("http://10.1.2.3/hook")
    page.get_by_role("button", name="Add endpoint").click()
    error = page.locator("#f-url-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("private")
    expect(url_input).to_have_attribute("aria-invalid", "true")

    url_input.fill(url)
    page.get_by_label("Description").fill("CI receiver")
    page.get_by_role("button", name="Add endpoint").click()
    expect(page.locator("#webhook-secret")).to_contain_text("whsec_")
    expect(page.locator("#webhooks-table")).to_contain_text(url)

    page.get_by_role("button", name=f"Send test to {url}").click()
    deliveries = page.locator("#deliveries-table > tbody > tr")
    expect(deliveries.first).to_contain_text("succeeded", timeout=30_000)
    assert received and received[0]["webhook-signature"].startswith("v1,")
    screenshot(page, "webhooks")
    audit(page, "webhooks")

    deliveries.first.get_by_role("button", name="Replay").click()
    expect(deliveries).to_have_count(2)
    expect(deliveries.first).to_contain_text("succeeded", timeout=30_000)
    assert len(received) == 2 and received[0]["webhook-id"] == received[1]["webhook-id"]
