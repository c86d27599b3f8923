"""The new-job form's field titles and help texts, which come from the recipe's schema: acronyms
spelled as such, and help that says what a field does rather than where its code lives."""

from __future__ import annotations

import re
import uuid

import pytest
from playwright.sync_api import expect

from tests.conftest import Service
from tests.frontend.conftest import sign_in

MODEL_ID, DATASET_ID = str(uuid.UUID(int=21)), str(uuid.UUID(int=22))
pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("service", ["sqlite"], indirect=True)]


def listing(item: dict):
    """A route handler answering a one-item page of a collection."""
    return lambda route: route.fulfill(json={"items": [item], "next_cursor": None})


def test_recipe_form_titles_and_help(page, service: Service):
    # one ready model and one dataset, so that the form is shown
    model = {"id": MODEL_ID, "filename": "m.onnx", "status": "ready", "sha256": "0" * 64, "size_bytes": 1}
    dataset = {"id": DATASET_ID, "filename": "d.npz", "sha256": "0" * 64, "size_bytes": 1, "num_samples": 8}
    for collection, item in (("models", model), ("datasets", dataset)):
        page.route(re.compile(rf"/api/v1/{collection}(\?.*)?$"), listing(item))
    sign_in(page, service.url, service.new_key(), "/jobs/new")
    expect(page.get_by_label("CPU latency", exact=True)).to_have_count(1)
    expect(page.get_by_label("TensorRT engine", exact=True)).to_have_count(1)
    form = page.locator("main")
    expect(form).to_contain_text("how each image becomes the model input: decoded")
    text = form.inner_text()
    for wrong in ("Cpu Latency", "Tensorrt Engine", ".py"):
        assert wrong not in text
