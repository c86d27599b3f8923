"""A model uploaded as a zip of its ONNX file and external data (`jobs.model_archives`), as
torch.onnx.export(..., dynamo=True) writes a model by default: checked from its listing, unpacked by
the worker's validation, quantized by a job; and the archives that must be refused."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from jobs.config import settings
from jobs.model_archives import (
    InvalidModelArchive,
    inspect_model_zip,
    is_zip,
    model_archive_limits,
    unpack_model_zip,
)
from quantcore import inspect_model
from samples.tiny import tiny_conv_bytes, tiny_conv_model
from tests.conftest import Service
from tests.test_api import assert_problem, leftovers, npz_bytes
from tests.test_comparison import run_job

LIMITS = model_archive_limits(settings)


def exported_with_external_data(directory: Path, name: str = "net.onnx") -> dict[str, bytes]:
    """The tiny model saved as onnx.save(..., save_as_external_data=True) writes it: {file name: bytes}."""
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(
        tiny_conv_model(), directory / name, save_as_external_data=True, location=f"{name}.data", size_threshold=0
    )
    return {path.name: path.read_bytes() for path in directory.iterdir()}


def zipped(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_an_archive_in_a_folder_unpacks_into_the_stored_model_with_its_data(tmp_path) -> None:
    files = exported_with_external_data(tmp_path / "export")
    assert set(files) == {"net.onnx", "net.onnx.data"}  # the weights really are outside the model file
    stored = tmp_path / "store" / "model.onnx"
    stored.parent.mkdir()
    stored.write_bytes(zipped({f"export/{n}": b for n, b in files.items()}))
    assert is_zip(stored)
    listing = inspect_model_zip(stored, limits=LIMITS)
    assert listing.model == "export/net.onnx" and listing.data == {"export/net.onnx.data": "net.onnx.data"}
    assert listing.expanded_bytes == sum(len(b) for b in files.values())
    unpack_model_zip(stored, listing)
    assert sorted(p.name for p in stored.parent.iterdir()) == ["model.onnx", "net.onnx.data"]
    assert not is_zip(stored)
    single = tmp_path / "single.onnx"
    single.write_bytes(tiny_conv_bytes())
    assert inspect_model(stored)["num_parameters"] == inspect_model(single)["num_parameters"] > 0


@pytest.mark.parametrize(
    ("members", "needle"),
    [
        ({"a.onnx": b"x", "b.onnx": b"y"}, "holds 2 .onnx files"),
        ({"weights.bin": b"x"}, "holds 0 .onnx files"),
        ({"m/net.onnx": b"x", "other/net.onnx.data": b"y"}, "'other/net.onnx.data' is outside the folder"),
        ({"m/net.onnx": b"x", "m/model.onnx.bin": b"y", "m/sub/../model.onnx.bin": b"z"}, "path traversal"),
        ({"net.onnx": b"x", "w/model.onnx": b"y"}, "2 .onnx files"),
    ],
    ids=["two-models", "no-model", "outside", "traversal", "nested-model"],
)
def test_archives_that_cannot_be_a_model_are_refused_with_the_member_named(tmp_path, members, needle) -> None:
    path = tmp_path / "upload"
    path.write_bytes(zipped(members))
    with pytest.raises(InvalidModelArchive, match=re.escape(needle)):
        inspect_model_zip(path, limits=LIMITS)


def test_a_zipped_model_with_external_data_is_stored_unpacked_and_quantized(service: Service, tmp_path) -> None:
    files = exported_with_external_data(tmp_path / "export")
    archive = zipped(files)
    rng = np.random.default_rng(2)
    data = npz_bytes(image=rng.normal(size=(24, 3, 8, 8)).astype(np.float32))
    key = service.new_key()
    with service.client(key) as client:
        # the model file alone is refused, with the way to make it one file
        alone = client.post("/models", files={"file": ("net.onnx", files["net.onnx"])})
        assert_problem(alone, 422, "'net.onnx.data' is missing", "onnx.save(onnx.load('model.onnx')")
        model, dataset = service.upload(key, archive, data)
        assert model["status"] == "ready" and model["filename"] == "model.onnx"
        assert model["size_bytes"] == sum(len(b) for b in files.values())  # unpacked, as the quota counts it
        assert model["info"]["num_parameters"] == 4 * 3 * 3 * 3 + 4 + 2 * 4 + 2
        stored = next((service.var_dir / "storage").glob(f"*/models/{model['id']}"))
        assert sorted(p.name for p in stored.iterdir()) == ["model.onnx", "net.onnx.data"]
        job = run_job(client, model["id"], dataset["id"], {"calibration": {"observer": "minmax"}})
        assert job["status"] == "succeeded", job
        # a broken archive is refused at upload, before anything is stored
        bad = client.post("/models", files={"file": ("bad.zip", zipped({"a.onnx": b"x", "b.onnx": b"y"}))})
        assert_problem(bad, 422, "not a usable onnx model", "exactly one is needed")
    assert leftovers(service) == []
