"""A model uploaded as a zip archive: the ONNX file with the external data files it references, as
`torch.onnx.export(..., dynamo=True)` writes a model by default (`model.onnx` and `model.onnx.data`) or
`onnx.save(..., save_as_external_data=True)` does.

    model.zip
    ├── model.onnx          exactly one `.onnx` member, under any name and at any depth
    └── model.onnx.data     the files it references, in its folder or below it

`inspect_model_zip` reads the central directory only: every member passes `jobs.archives.checked_members`
(names, path traversal, symbolic links, encryption, sizes), and none may lie outside the `.onnx` member's
folder. The API checks an upload this way before storing it and books the unpacked size against the
quota; the worker's validation then calls `unpack_model_zip`, which writes the data files beside the
archive and the model over it, so the stored model is `model.onnx` with its data next to it, as a
single-file upload would be. The external-data locations inside the model are checked afterwards, by
the same validation as any model's (`quantcore.prepare.validate.check_external_data`).
"""

from __future__ import annotations

import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from jobs.archives import ArchiveLimits, checked_members, open_zip

if TYPE_CHECKING:
    from jobs.config import Settings

ZIP_MAGIC = b"PK\x03\x04"  # a zip's first local header; an ONNX protobuf starts with a field tag
# The legacy exporter writes one external file per initializer: thousands for a large network.
MAX_MEMBERS = 20_000


class InvalidModelArchive(ValueError):
    pass


@dataclass(frozen=True)
class ModelListing:
    model: str  # the `.onnx` member
    data: dict[str, str]  # data member -> its path relative to the model's folder
    expanded_bytes: int  # every member unpacked: what the stored model takes on disk


def is_zip(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(len(ZIP_MAGIC)) == ZIP_MAGIC


def model_archive_limits(settings: Settings) -> ArchiveLimits:
    """The unpacked model may take what a single-file upload may: `max_model_bytes`. Weights compress
    little, and an all-zero buffer a lot, so no compression ratio is refused: the size cap bounds it."""
    return ArchiveLimits(
        max_files=MAX_MEMBERS,
        max_file_bytes=settings.max_model_bytes,
        max_total_bytes=settings.max_model_bytes,
        max_ratio=float("inf"),
    )


def inspect_model_zip(path: Path, *, limits: ArchiveLimits) -> ModelListing:
    """The archive's model and data members; raises `InvalidModelArchive` naming what is wrong."""
    with open_zip(path, limits.max_files, InvalidModelArchive) as archive:
        members = list(checked_members(archive, limits, InvalidModelArchive))
    models = [m.filename for m in members if m.filename.lower().endswith(".onnx")]
    if len(models) != 1:
        raise InvalidModelArchive(
            f"the zip archive holds {len(models)} .onnx files {models[:5]}; exactly one is needed: the model, "
            "with the external data files it references"
        )
    model = models[0]
    folder = PurePosixPath(model).parent
    data: dict[str, str] = {}
    for member in members:
        if member.filename == model:
            continue
        name = PurePosixPath(member.filename)
        if not name.is_relative_to(folder):
            raise InvalidModelArchive(
                f"member '{member.filename}' is outside the folder of '{model}': external data lies beside the "
                "model or below it"
            )
        data[member.filename] = name.relative_to(folder).as_posix()  # not "model.onnx": that is a 2nd model
    return ModelListing(model, data, sum(m.file_size for m in members))


def unpack_model_zip(path: Path, listing: ModelListing) -> None:
    """Write the data files beside `path` and the model over it (the archive is replaced). Reads stop at
    each member's declared size, which `inspect_model_zip` bounded, and check its CRC."""
    folder = path.parent
    staged = folder / f".{path.name}.unpacking"
    with zipfile.ZipFile(path) as archive:
        for member, relative in listing.data.items():
            target = folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, target.open("wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
        with archive.open(listing.model) as source, staged.open("wb") as sink:
            shutil.copyfileobj(source, sink, 1 << 20)
    os.replace(staged, path)
