"""Read an image-zip dataset's listing safely, from the zip's central directory only (the member
checks, `open_zip` and `checked_members`, also serve model archives: `jobs.model_archives`).

    archive.zip
    ├── cat/0001.jpg        one folder per class: labels = sorted folder names → 0, 1, ...
    ├── dog/0002.png
    └── labels.csv          or a CSV `file,label` (label: a class name, or an integer class id)

Nothing is decompressed here except `labels.csv` (read with a byte cap): images are decoded by
the worker. Every member is refused, with its name in the message, when it could escape or
exhaust the machine: an absolute name, a `..` component, a backslash, a symlink, encryption, a
duplicate name, more than `max_files` members, a declared size over `max_file_bytes`, a sum over
`max_total_bytes`, or a compression ratio (declared size / compressed size) over `max_ratio`
(JPEG and PNG are compressed already, so a high ratio means a zip bomb, not an image; an `.npz`
takes the ratio over the whole archive instead, `ratio_over="archive"`, since one constant array
in it legitimately compresses ~1000:1). The
declared sizes are what the worker's reads are bounded by (`zipfile` stops at the declared size
and checks the CRC), so a member that lies about its size fails there rather than expanding.

The image list is sorted by name, so the worker re-reading the listing sees the same order and
the seeded split picks the same files.
"""

from __future__ import annotations

import csv
import io
import stat
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from jobs.config import Settings

IMAGE_FORMATS = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png"}
LABELS_CSV = "labels.csv"
MAX_CSV_BYTES = 16 * 1024 * 1024
MAX_CLASSES = 100_000
# Archivers' metadata that carries no data: skipped, not refused.
_JUNK_PREFIXES = ("__MACOSX/",)
_JUNK_NAMES = (".DS_Store", "Thumbs.db")

LabelSource = Literal["folders", "csv"]


class InvalidImageArchive(ValueError):
    pass


@dataclass(frozen=True)
class ArchiveLimits:
    max_files: int
    max_file_bytes: int
    max_total_bytes: int
    max_ratio: float
    ratio_over: Literal["member", "archive"] = "member"


def archive_limits(settings: Settings) -> ArchiveLimits:
    return ArchiveLimits(
        max_files=settings.max_dataset_images,
        max_file_bytes=settings.max_image_bytes,
        max_total_bytes=settings.max_images_expanded_bytes,
        max_ratio=settings.max_archive_ratio,
    )


@dataclass(frozen=True)
class ImageListing:
    files: list[str]  # member names, sorted
    labels: list[int] | None  # class id per file, aligned with `files`
    classes: list[str]  # class id i is classes[i]; empty without labels
    label_source: LabelSource | None
    formats: dict[str, int]  # jpeg / png → count
    expanded_bytes: int

    def summary(self) -> dict:
        """What the dataset row stores (the file list itself is re-read from the archive)."""
        return {
            "num_images": len(self.files),
            "formats": self.formats,
            "classes": self.classes,
            "label_source": self.label_source,
            "expanded_bytes": self.expanded_bytes,
        }


_EOCD = b"PK\x05\x06"  # end of central directory record
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"
_EOCD_SEARCH = 22 + 65535  # the record (22 bytes) plus the longest archive comment


def declared_members(path: Path) -> int | None:
    """The member count the archive's end record declares, read from its last 64 kB only; None when
    there is no end record. `zipfile` would build an object per member before any cap could apply,
    so a 1 GB directory of empty entries is refused from this number first."""
    with path.open("rb") as handle:
        size = handle.seek(0, 2)
        start = max(0, size - _EOCD_SEARCH)
        handle.seek(start)
        tail = handle.read()
        at = tail.rfind(_EOCD)
        if at < 0 or len(tail) < at + 22:
            return None
        count = int.from_bytes(tail[at + 10 : at + 12], "little")  # entries in total
        locator = at - 20
        if count == 0xFFFF and locator >= 0 and tail[locator : locator + 4] == _ZIP64_LOCATOR:
            handle.seek(int.from_bytes(tail[locator + 8 : locator + 16], "little"))
            record = handle.read(56)
            if record[:4] == _ZIP64_EOCD and len(record) == 56:
                count = int.from_bytes(record[32:40], "little")
        return count


def is_image_zip(path: Path, *, max_files: int) -> bool:
    """An image archive rather than an `.npz`: a readable zip whose members are not all top-level `.npy`.
    A zip declaring more than `max_files` members counts as one (`inspect_image_zip` then refuses it)."""
    count = declared_members(path)
    if count is not None and count > max_files:
        return True
    try:
        with zipfile.ZipFile(path) as archive:
            names = [m.filename for m in archive.infolist() if not m.is_dir()]
    except (zipfile.BadZipFile, OSError):
        return False
    return bool(names) and not all(n.endswith(".npy") and "/" not in n for n in names)


def _check_name(name: str, error: type[ValueError]) -> None:
    if "\x00" in name or "\\" in name:
        raise error(f"member '{name!r}' has a backslash or NUL in its name")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise error(f"member '{name}' has an absolute path")
    parts = PurePosixPath(name).parts
    if ".." in parts or any(p == "." for p in parts):
        raise error(f"member '{name}' has a '..' or '.' component (path traversal)")


def _is_junk(name: str) -> bool:
    return name.startswith(_JUNK_PREFIXES) or PurePosixPath(name).name in _JUNK_NAMES


def open_zip(path: Path, max_files: int, error: type[ValueError]) -> zipfile.ZipFile:
    """The archive at `path`, its declared member count checked first (`declared_members`)."""
    count = declared_members(path)
    if count is not None and count > max_files:
        raise error(f"the archive holds {count} members; at most {max_files} allowed")
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise error(f"not a readable zip archive: {exc}") from exc


def checked_members(
    archive: zipfile.ZipFile, limits: ArchiveLimits, error: type[ValueError]
) -> Iterator[zipfile.ZipInfo]:
    """The archive's files (no directories, no archiver junk), each checked as the module docstring
    says before it is yielded; `error` names the first member that fails."""
    members = archive.infolist()
    if len(members) > limits.max_files:
        raise error(f"the archive holds {len(members)} members; at most {limits.max_files} allowed")
    if limits.ratio_over == "archive":
        files = [m for m in members if not m.is_dir()]
        ratio = sum(m.file_size for m in files) / max(sum(m.compress_size for m in files), 1)
        if ratio > limits.max_ratio:
            raise error(
                f"the archive has a compression ratio of {ratio:.0f}:1 (at most {limits.max_ratio:.0f}:1): a zip bomb"
            )
    seen: set[str] = set()
    total = 0
    for member in members:
        name = member.filename
        _check_name(name, error)
        if name in seen:
            raise error(f"member '{name}' appears twice")
        seen.add(name)
        if stat.S_ISLNK(member.external_attr >> 16):
            raise error(f"member '{name}' is a symbolic link")
        if member.is_dir() or _is_junk(name):
            continue
        if member.flag_bits & 0x1:
            raise error(f"member '{name}' is encrypted")
        if member.file_size > limits.max_file_bytes:
            raise error(
                f"member '{name}' expands to {member.file_size} bytes; at most {limits.max_file_bytes} per file"
            )
        total += member.file_size
        if total > limits.max_total_bytes:
            raise error(f"the archive expands to more than {limits.max_total_bytes} bytes")
        ratio = member.file_size / max(member.compress_size, 1)
        if limits.ratio_over == "member" and ratio > limits.max_ratio:
            raise error(
                f"member '{name}' has a compression ratio of {ratio:.0f}:1 (at most {limits.max_ratio:.0f}:1): "
                "a zip bomb"
            )
        yield member


def inspect_image_zip(path: Path, *, limits: ArchiveLimits) -> ImageListing:
    """List and check the archive's images and labels; raises `InvalidImageArchive` naming the member."""
    with open_zip(path, limits.max_files, InvalidImageArchive) as archive:
        images: list[zipfile.ZipInfo] = []
        csv_member: zipfile.ZipInfo | None = None
        total = 0
        for member in checked_members(archive, limits, InvalidImageArchive):
            name = member.filename
            total += member.file_size
            suffix = PurePosixPath(name).suffix.lower()
            if name == LABELS_CSV:
                csv_member = member
            elif suffix in IMAGE_FORMATS:
                images.append(member)
            else:
                raise InvalidImageArchive(
                    f"member '{name}' is neither a JPEG/PNG image nor {LABELS_CSV} (accepted: .jpg, .jpeg, .png)"
                )
        if len(images) < 2:
            raise InvalidImageArchive(
                f"the archive holds {len(images)} image(s); at least 2 are needed: some to calibrate, some to evaluate"
            )
        files = sorted(m.filename for m in images)
        formats: dict[str, int] = {}
        for name in files:
            kind = IMAGE_FORMATS[PurePosixPath(name).suffix.lower()]
            formats[kind] = formats.get(kind, 0) + 1
        if csv_member is not None:
            with archive.open(csv_member) as handle:
                text = handle.read(MAX_CSV_BYTES + 1)
            if len(text) > MAX_CSV_BYTES:
                raise InvalidImageArchive(f"{LABELS_CSV} is larger than {MAX_CSV_BYTES} bytes")
            labels, classes = _csv_labels(text, files)
            source: LabelSource | None = "csv"
        else:
            labels, classes, source = _folder_labels(files)
    return ImageListing(
        files=files,
        labels=labels,
        classes=classes,
        label_source=source,
        formats=formats,
        expanded_bytes=total,
    )


def _folder_labels(files: list[str]) -> tuple[list[int] | None, list[str], LabelSource | None]:
    """Each image's parent folder is its class. All at the top level, or all in one folder (a wrapper
    such as `images/`), means no labels; some in folders and some not is refused as ambiguous."""
    parents = [str(PurePosixPath(name).parent) for name in files]
    at_top = [name for name, parent in zip(files, parents, strict=True) if parent == "."]
    if at_top and len(at_top) < len(files):
        raise InvalidImageArchive(
            f"image '{at_top[0]}' is at the top level while others are in class folders: put every image in a "
            f"class folder, or none, or give {LABELS_CSV}"
        )
    classes = sorted(set(parents))
    if at_top or len(classes) == 1:
        return None, [], None
    index = {name: i for i, name in enumerate(classes)}
    return [index[parent] for parent in parents], classes, "folders"


def _csv_labels(raw: bytes, files: list[str]) -> tuple[list[int], list[str]]:
    """`file,label` rows (a header row naming those columns is optional). Labels that are all
    non-negative integers are class ids as given; otherwise class names, numbered in sorted order."""
    try:
        rows = list(csv.reader(io.StringIO(raw.decode("utf-8-sig"))))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InvalidImageArchive(f"{LABELS_CSV} is not a UTF-8 CSV: {exc}") from exc
    rows = [row for row in rows if row and any(cell.strip() for cell in row)]
    if rows and [cell.strip().lower() for cell in rows[0]] == ["file", "label"]:
        rows = rows[1:]
    by_file: dict[str, str] = {}
    for number, row in enumerate(rows, start=1):
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise InvalidImageArchive(f"{LABELS_CSV} row {number}: expected 'file,label', got {row!r}")
        name, label = row[0].strip(), row[1].strip()
        if name in by_file:
            raise InvalidImageArchive(f"{LABELS_CSV} row {number}: '{name}' is labelled twice")
        by_file[name] = label
    present = set(files)
    unknown = sorted(set(by_file) - present)
    if unknown:
        raise InvalidImageArchive(f"{LABELS_CSV} names '{unknown[0]}', which is not an image in the archive")
    missing = [name for name in files if name not in by_file]
    if missing:
        raise InvalidImageArchive(f"image '{missing[0]}' has no row in {LABELS_CSV} ({len(missing)} unlabelled)")
    values = [by_file[name] for name in files]
    if all(v.isdigit() for v in values):
        ids = [int(v) for v in values]
        if max(ids) >= MAX_CLASSES:
            raise InvalidImageArchive(f"{LABELS_CSV}: class id {max(ids)} is out of range (below {MAX_CLASSES})")
        return ids, [str(i) for i in range(max(ids) + 1)]
    classes = sorted(set(values))
    index = {name: i for i, name in enumerate(classes)}
    return [index[v] for v in values], classes
