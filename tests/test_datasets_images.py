"""Image-zip datasets: safe listing, decoding in a worker, preprocessing, labels, and a real job.

The archive checks (`jobs.archives`) and the preprocessing (`worker.images`) are tested directly;
then through the service: uploads of hostile or broken archives get a problem+json naming the member,
a recipe whose preprocessing cannot feed the model gets one naming the field, and a zip of PNG and
JPEG images in class folders runs as a job to `succeeded` with top-1 in its report.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import stat
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image
from pydantic import ValidationError

from cli import quantctl
from jobs.archives import ArchiveLimits, InvalidImageArchive, declared_members, inspect_image_zip
from jobs.models import Dataset, DatasetKind
from jobs.preprocessing import PreprocessingSpec, job_input_mismatches, preprocessing_mismatches
from jobs.recipe import Recipe
from quantcore.errors import InvalidDataError
from tests.conftest import Service
from tests.test_api import assert_problem, leftovers, npz_bytes
from tests.test_e2e import read_events
from worker.images import load_images, preprocess, verify_images

LIMITS = ArchiveLimits(max_files=100, max_file_bytes=1 << 20, max_total_bytes=1 << 22, max_ratio=100.0)
RED, BLUE = (220, 30, 20), (20, 30, 220)


def encode(color: tuple[int, int, int], fmt: str, *, seed: int, size: tuple[int, int] = (12, 10)) -> bytes:
    """A (width, height) image of one color plus a little noise, as PNG or JPEG bytes."""
    noise = np.random.default_rng(seed).integers(-20, 21, size=(size[1], size[0], 3))
    pixels = np.clip(np.asarray(color) + noise, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def zip_bytes(members: dict[str, bytes], *, compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def class_folders(per_class: int = 12) -> dict[str, bytes]:
    """red/ and blue/ folders, alternating PNG and JPEG."""
    members = {}
    for cls, color in (("red", RED), ("blue", BLUE)):
        for i in range(per_class):
            fmt, suffix = ("PNG", "png") if i % 2 else ("JPEG", "jpg")
            members[f"{cls}/{i:03d}.{suffix}"] = encode(color, fmt, seed=i + (100 if cls == "red" else 0))
    return members


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "images.zip"
    path.write_bytes(data)
    return path


# The listing ---------------------------------------------------------------------------------


def test_folders_become_sorted_class_ids(tmp_path: Path) -> None:
    listing = inspect_image_zip(write(tmp_path, zip_bytes(class_folders(3))), limits=LIMITS)
    assert listing.classes == ["blue", "red"] and listing.label_source == "folders"
    assert listing.files[0] == "blue/000.jpg" and listing.files == sorted(listing.files)
    assert listing.labels == [0, 0, 0, 1, 1, 1]
    assert listing.formats == {"jpeg": 4, "png": 2}


def test_labels_csv_by_name_or_id(tmp_path: Path) -> None:
    images = {f"{i}.png": encode(RED, "PNG", seed=i) for i in range(3)}
    named = zip_bytes({**images, "labels.csv": b"file,label\n0.png,dog\n1.png,cat\n2.png,dog\n"})
    listing = inspect_image_zip(write(tmp_path, named), limits=LIMITS)
    assert (listing.classes, listing.labels, listing.label_source) == (["cat", "dog"], [1, 0, 1], "csv")
    by_id = zip_bytes({**images, "labels.csv": b"0.png,7\n1.png,0\n2.png,3\n"})
    assert inspect_image_zip(write(tmp_path, by_id), limits=LIMITS).labels == [7, 0, 3]
    missing = zip_bytes({**images, "labels.csv": b"0.png,1\n1.png,0\n"})
    with pytest.raises(InvalidImageArchive, match=r"'2\.png' has no row"):
        inspect_image_zip(write(tmp_path, missing), limits=LIMITS)


def test_unlabelled_and_ambiguous_layouts(tmp_path: Path) -> None:
    flat = {f"{i}.png": encode(RED, "PNG", seed=i) for i in range(3)}
    assert inspect_image_zip(write(tmp_path, zip_bytes(flat)), limits=LIMITS).labels is None
    wrapped = {f"images/{name}": data for name, data in flat.items()}
    assert inspect_image_zip(write(tmp_path, zip_bytes(wrapped)), limits=LIMITS).labels is None
    mixed = {**flat, "cat/x.png": flat["0.png"]}
    with pytest.raises(InvalidImageArchive, match="top level while others are in class folders"):
        inspect_image_zip(write(tmp_path, zip_bytes(mixed)), limits=LIMITS)


@pytest.mark.parametrize(
    ("name", "needle"),
    [("../evil.png", "path traversal"), ("a/../../evil.png", "path traversal"), ("/etc/evil.png", "absolute")],
)
def test_escaping_names_are_refused(tmp_path: Path, name: str, needle: str) -> None:
    data = zip_bytes({"ok/1.png": encode(RED, "PNG", seed=1), name: encode(RED, "PNG", seed=2)})
    with pytest.raises(InvalidImageArchive, match=needle) as info:
        inspect_image_zip(write(tmp_path, data), limits=LIMITS)
    assert name in str(info.value)


def test_symlinks_are_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("a/1.png", encode(RED, "PNG", seed=1))
        link = zipfile.ZipInfo("a/2.png")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    with pytest.raises(InvalidImageArchive, match=re.escape("'a/2.png' is a symbolic link")):
        inspect_image_zip(write(tmp_path, buffer.getvalue()), limits=LIMITS)


def test_caps_on_count_size_and_ratio(tmp_path: Path) -> None:
    many = zip_bytes({f"{i}.png": b"x" for i in range(LIMITS.max_files + 1)})
    with pytest.raises(InvalidImageArchive, match="at most 100 allowed"):
        inspect_image_zip(write(tmp_path, many), limits=LIMITS)
    # 1 MiB of zeros deflates to about 1 kB: a ratio near 1000:1, where a real PNG/JPEG is close to 1:1.
    bomb = zip_bytes({"a.png": encode(RED, "PNG", seed=1), "b.png": bytes(LIMITS.max_file_bytes)})
    with pytest.raises(InvalidImageArchive, match=r"'b\.png' has a compression ratio of \d+:1"):
        inspect_image_zip(write(tmp_path, bomb), limits=LIMITS)
    big = zip_bytes({"a.png": b"x", "b.png": bytes(LIMITS.max_file_bytes + 1)}, compression=zipfile.ZIP_STORED)
    with pytest.raises(InvalidImageArchive, match=r"'b\.png' expands to"):
        inspect_image_zip(write(tmp_path, big), limits=LIMITS)
    other = zip_bytes({"a.png": b"x", "notes.txt": b"hello"})
    with pytest.raises(InvalidImageArchive, match=re.escape("'notes.txt' is neither")):
        inspect_image_zip(write(tmp_path, other), limits=LIMITS)


@pytest.mark.parametrize("members", [3, 70_000], ids=["zip", "zip64"])
def test_member_count_is_read_from_the_end_record(tmp_path: Path, members: int) -> None:
    path = write(tmp_path, zip_bytes({f"{i}.png": b"" for i in range(members)}, compression=zipfile.ZIP_STORED))
    # Beyond 65,535 members the count lives in the ZIP64 end record; both must match what zipfile lists.
    with zipfile.ZipFile(path) as archive:
        assert declared_members(path) == len(archive.infolist()) == members
    assert declared_members(write(tmp_path, b"not a zip at all")) is None


def test_corrupt_and_oversized_images_are_named(tmp_path: Path) -> None:
    good = encode(RED, "PNG", seed=1)
    path = write(tmp_path, zip_bytes({"a/1.png": good, "a/2.png": good[: len(good) // 2]}))
    with pytest.raises(InvalidDataError, match=re.escape("image 'a/2.png' cannot be decoded")):
        verify_images(path, ["a/1.png", "a/2.png"], max_pixels=10_000)
    with pytest.raises(InvalidDataError, match=re.escape("image 'a/1.png' declares 12x10 pixels")):
        verify_images(path, ["a/1.png"], max_pixels=100)


# Preprocessing -------------------------------------------------------------------------------


def test_preprocessing_formula_channel_order_and_layout() -> None:
    image = Image.new("RGB", (6, 4), (255, 128, 0))
    spec = PreprocessingSpec(center_crop=(2, 4), mean=[0.5, 0.5, 0.5], std=[0.25, 0.5, 1.0])
    sample = preprocess(image, spec, "x.png")
    assert sample.shape == (3, 2, 4) and sample.dtype == np.float32
    # x = (pixel / 255 - mean) / std per channel, computed in float32: values of order 1 carry an
    # absolute error of a few float32 ulps (1.2e-7 each), which 1e-6 bounds with room.
    expected = (np.array([255, 128, 0]) / 255 - 0.5) / np.array([0.25, 0.5, 1.0])
    np.testing.assert_allclose(sample[:, 0, 0], expected, rtol=0, atol=1e-6)
    bgr = preprocess(image, spec.model_copy(update={"channel_order": "bgr", "layout": "nhwc"}), "x.png")
    assert bgr.shape == (2, 4, 3)
    np.testing.assert_allclose(bgr[0, 0], [(0 - 0.5) / 0.25, (128 / 255 - 0.5) / 0.5, 0.5], rtol=0, atol=1e-6)
    raw = preprocess(image, PreprocessingSpec(resize=(3, 5), scale=1, dtype="uint8", channel_order="gray"), "x")
    assert raw.shape == (1, 3, 5) and raw.dtype == np.uint8


def test_resize_shorter_side_then_crop_and_too_small(tmp_path: Path) -> None:
    path = write(tmp_path, zip_bytes({"a.png": encode(RED, "PNG", seed=1, size=(30, 20)), "b.png": b""}))
    batch = load_images(path, ["a.png"], PreprocessingSpec(resize=10, center_crop=(10, 14)), max_pixels=10_000)
    assert batch.shape == (1, 3, 10, 14)  # 30x20 → shorter side 10 → 15x10 → crop 14x10
    with pytest.raises(InvalidDataError, match=re.escape("'a.png' is 15x10 after resizing, smaller than the 16x16")):
        load_images(path, ["a.png"], PreprocessingSpec(resize=10, center_crop=16), max_pixels=10_000)


def test_spec_validation_names_the_field() -> None:
    with pytest.raises(ValidationError, match="input size must not depend on the image"):
        PreprocessingSpec(resize=8)
    with pytest.raises(ValidationError, match=r"std\n.*needs 1 value"):
        PreprocessingSpec(center_crop=8, channel_order="gray", std=[1, 1, 1])
    with pytest.raises(ValidationError, match="uint8 takes raw pixels"):
        PreprocessingSpec(center_crop=8, dtype="uint8")
    info = {"inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, 8, 8], "batch_axis": 0}]}
    assert preprocessing_mismatches(info, PreprocessingSpec(center_crop=8), 10) == []
    problems = preprocessing_mismatches(info, PreprocessingSpec(center_crop=8, layout="nhwc"), 10)
    assert [field for field, _ in problems] == ["recipe.preprocessing"] * 2  # axes 1 and 3 differ
    assert "axis 1 must be 3" in problems[0][1] and "axis 3 must be 8" in problems[1][1]


def test_decoded_images_are_capped_naming_the_field() -> None:
    info = {"inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, 8, 8], "batch_axis": 0}]}
    dataset = Dataset(kind=DatasetKind.images, num_samples=1000, arrays=[])
    recipe = Recipe(preprocessing=PreprocessingSpec(center_crop=8), calibration={"num_samples": 500})
    per_image = 3 * 8 * 8 * 4  # float32 bytes
    # 200 held out (20 %) + 500 calibrating = 700 images.
    assert job_input_mismatches(info, dataset=dataset, recipe=recipe, max_decoded_bytes=700 * per_image) == []
    [(field, message)] = job_input_mismatches(info, dataset=dataset, recipe=recipe, max_decoded_bytes=699 * per_image)
    assert field == "recipe.calibration.num_samples" and "500 calibration + 200 evaluation images" in message


# Through the service -------------------------------------------------------------------------


def color_model() -> bytes:
    """image (N,3,8,8) → GlobalAveragePool → Flatten → Gemm → logits (N,2): class 0 when the mean blue
    exceeds the mean red, class 1 otherwise, so sorted folders blue=0, red=1 are classified exactly."""
    weight = numpy_helper.from_array(np.array([[-1, 0, 1], [1, 0, -1]], np.float32), "fc.weight")
    bias = numpy_helper.from_array(np.zeros(2, np.float32), "fc.bias")
    nodes = [
        helper.make_node("GlobalAveragePool", ["image"], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "color",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [weight, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


PREPROCESSING = {"resize": 10, "center_crop": 8, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}


@pytest.fixture(scope="module")
def images(service: Service) -> dict:
    key = service.new_key()
    with service.client(key) as client:
        model = client.post("/models", files={"file": ("color.onnx", color_model())})
        assert model.status_code == 201, model.text
        dataset = client.post("/datasets", files={"file": ("colors.zip", zip_bytes(class_folders()))})
        assert dataset.status_code == 201, dataset.text
    return {"key": key, "model": model.json(), "dataset": dataset.json()}


def test_image_dataset_upload_is_described(images: dict) -> None:
    dataset = images["dataset"]
    assert (dataset["kind"], dataset["status"], dataset["num_samples"]) == ("images", "ready", 24)
    assert dataset["arrays"] == []
    assert dataset["images"]["classes"] == ["blue", "red"] and dataset["images"]["label_source"] == "folders"
    assert dataset["images"]["formats"] == {"jpeg": 12, "png": 12}


def test_quantctl_uploads_an_image_zip(service: Service, images: dict, tmp_path: Path, capsys) -> None:
    path = write(tmp_path, zip_bytes(class_folders(2)))
    argv = ["--url", service.url, "--api-key", images["key"], "--no-progress", "datasets", "upload", str(path)]
    assert quantctl.main(argv) == 0
    dataset = json.loads(capsys.readouterr().out)
    assert (dataset["kind"], dataset["status"], dataset["num_samples"]) == ("images", "ready", 4)


def test_image_job_succeeds_with_top1_and_the_split_recorded(service: Service, images: dict) -> None:
    recipe = {"evaluation": {"holdout_fraction": 0.25}, "preprocessing": PREPROCESSING, "seed": 3}
    body = {"model_id": images["model"]["id"], "dataset_id": images["dataset"]["id"], "recipe": recipe}
    with service.client(images["key"]) as client:
        created = client.post("/jobs", json=body)
        assert created.status_code == 202, created.text
        with client.stream("GET", f"/jobs/{created.json()['id']}/events") as response:
            read_events(response)
        job = client.get(f"/jobs/{created.json()['id']}").json()
        assert job["status"] == "succeeded", job
        report = client.get(f"/jobs/{job['id']}/report").json()
    evaluation = report["evaluation"]
    # Red and blue differ by ~200 levels in the mean: every held-out image is classified by its folder,
    # in FP32 and after INT8 (the margin is hundreds of quantization steps). A label misaligned with its
    # file, or swapped channels, would drop these to 0.
    assert evaluation["fp32"]["top1"] == 1.0 and evaluation["qdq_exact"]["top1"] == 1.0, evaluation
    split = report["dataset"]
    assert split["kind"] == "images" and split["seed"] == 3 and split["num_samples"] == 24
    assert split["evaluation"]["count"] == 6 == evaluation["num_samples"]  # round(24 x 0.25)
    assert split["calibration"]["count"] == 18 and len(split["evaluation"]["sha256"]) == 64
    assert split["label_source"] == "folders" and split["classes"] == ["blue", "red"]


def test_wrong_preprocessing_shape_or_kind_is_refused_naming_the_field(service: Service, images: dict) -> None:
    base = {"model_id": images["model"]["id"], "dataset_id": images["dataset"]["id"]}
    with service.client(images["key"]) as client:
        wrong = client.post("/jobs", json={**base, "recipe": {"preprocessing": {**PREPROCESSING, "center_crop": 9}}})
        body = assert_problem(wrong, 422, "recipe.preprocessing", "axis 2 must be 8")
        assert body["errors"][0]["field"] == "recipe.preprocessing"
        assert_problem(client.post("/jobs", json=base), 422, "recipe.preprocessing", "needs a preprocessing")
        bad_std = {"preprocessing": {**PREPROCESSING, "std": [1, 0, 1]}}
        assert_problem(client.post("/jobs", json={**base, "recipe": bad_std}), 422, "recipe.preprocessing.std")
        arrays = npz_bytes(image=np.zeros((4, 3, 8, 8), np.float32))
        npz = client.post("/datasets", files={"file": ("a.npz", arrays)}).json()
        on_npz = {**base, "dataset_id": npz["id"], "recipe": {"preprocessing": PREPROCESSING}}
        assert_problem(client.post("/jobs", json=on_npz), 422, "recipe.preprocessing", "image datasets only")


@pytest.mark.parametrize(
    ("members", "needles"),
    [
        ({"../x.png": b"x", "a.png": b"x"}, ["'../x.png'", "path traversal"]),
        ({f"{i}.png": b"x" for i in range(501)}, ["501 members", "at most 500"]),
        ({"a.png": b"x", "b.png": bytes(4 << 20)}, ["'b.png'", "compression ratio"]),
    ],
    ids=["traversal", "too-many-files", "zip-bomb"],
)
def test_hostile_archives_get_a_problem_naming_the_member(service: Service, members: dict, needles: list) -> None:
    with service.client() as client:
        response = client.post("/datasets", files={"file": ("bad.zip", zip_bytes(members))})
        assert_problem(response, 422, "not a usable dataset", *needles)
        assert client.get("/datasets").json()["items"] == []
    assert leftovers(service) == []


def test_corrupt_image_is_found_by_the_worker_and_named(service: Service) -> None:
    members = class_folders(2)
    members["red/001.png"] = members["red/001.png"][:40]  # the header survives, the pixels do not
    data = zip_bytes(members)
    with service.client() as client:
        response = client.post("/datasets", files={"file": ("broken.zip", data)})
        assert_problem(response, 422, "not a usable image dataset", "image 'red/001.png' cannot be decoded")
        assert client.get("/datasets").json()["items"] == []  # the row is gone
    digest = hashlib.sha256(data).hexdigest()
    stored = (service.var_dir / "storage").glob("*/datasets/*/images.zip")
    assert all(hashlib.sha256(path.read_bytes()).hexdigest() != digest for path in stored)  # and the file
