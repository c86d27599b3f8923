"""`quantctl`: drive the quantization service over HTTP.

    quantctl [--url URL] [--api-key KEY] [--timeout S] [--no-progress] COMMAND ...

    models upload FILE.onnx|MODEL.zip [--no-wait]  models list [--limit N] [--cursor C] [--all] [--json]
    models show ID
    datasets upload FILE.npz|IMAGES.zip      datasets show ID
    compare MODEL_ID [--limit N] [--cursor C] [--all] [--json]
    jobs submit --model ID --dataset ID [--recipe FILE] [--set KEY=VALUE ...] [--watch]
    jobs list [--status S] [--limit N] [--cursor C] [--all] [--json]
    jobs show ID | cancel ID | watch ID | report ID [--json]
    jobs download ID [--name ARTIFACT ...] [-o DIR]
    quantize MODEL.onnx|MODEL.zip DATA.npz|IMAGES.zip [--recipe FILE] [--set KEY=VALUE ...] [-o DIR]

The URL and key come from `--url`/`--api-key`, else `QUANT_API_URL`/`QUANT_API_KEY`; the global
options are accepted before or after the command. JSON goes to stdout, progress and errors to
stderr. Exit codes: 0 success, 1 an API error or a job that did not succeed, 2 a usage error,
130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from cli.client import DEFAULT_URL, ApiError, Client, ProtocolError, job_path, resource_path
from cli.recipe import RecipeError, build_recipe
from cli.report_text import render_report
from cli.transfer import DownloadError, download, model_upload, upload
from cli.watch import JobWatcher

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Arguments that parse but make no sense (exit code 2)."""


@dataclass
class Context:
    client: Client
    progress: bool | None  # None: a bar only when stderr is a terminal
    model_wait: float = 600.0  # seconds to poll a pending model


Handler = Callable[[Context, argparse.Namespace], int]


# ---------------------------------------------------------------- output


def emit_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def note(message: str) -> None:
    print(message, file=sys.stderr)


def print_table(items: list[dict[str, Any]], columns: Sequence[tuple[str, Callable[[dict[str, Any]], Any]]]) -> None:
    rows = [[title for title, _ in columns]]
    rows += [["" if (cell := get(item)) is None else str(cell) for _, get in columns] for item in items]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _percent(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, int | float) else ""


MODEL_COLUMNS = (
    ("ID", lambda m: m.get("id")),
    ("STATUS", lambda m: m.get("status")),
    ("SIZE", lambda m: m.get("size_bytes")),
    ("FILENAME", lambda m: m.get("filename")),
    ("CREATED", lambda m: m.get("created_at")),
)
JOB_COLUMNS = (
    ("ID", lambda j: j.get("id")),
    ("STATUS", lambda j: j.get("status")),
    ("STAGE", lambda j: j.get("stage")),
    ("PROGRESS", lambda j: _percent(j.get("progress"))),
    ("CREATED", lambda j: j.get("created_at")),
)


# ---------------------------------------------------------------- models and datasets


def upload_checked(ctx: Context, collection: str, path: Path, *, wait: bool = True) -> dict[str, Any]:
    """Upload a model or dataset, then poll while its validation task has not decided (202 / pending).
    A model with its external data file beside it goes up as one zip of both (`model_upload`); bytes the
    project holds already come back as that model or dataset (200), which is said."""
    with model_upload(path) if collection == "models" else contextlib.nullcontext(path) as sent:
        if sent != path:
            note(f"{path.name} keeps its weights in {path.name}.data: uploading both, as one zip")
        status, row = upload(ctx.client, collection, sent, filename=path.name, progress=ctx.progress)
    if status == 200:  # the project held these bytes already: the API answered with that row
        note(f"reused {collection[:-1]} {row.get('id')}: the project already holds {path.name} (same SHA-256)")
    if not wait or row.get("status") != "pending":
        return row
    deadline, delay = time.monotonic() + ctx.model_wait, 0.5
    note(f"{collection[:-1]} {row.get('id')} uploaded; waiting for validation")
    while row.get("status") == "pending" and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 1.5, 5.0)
        row = ctx.client.get_json(resource_path(collection, str(row["id"])))
    return row


def validation_outcome(row: dict[str, Any], collection: str = "models") -> int:
    status, kind = row.get("status"), collection[:-1]
    if status == "invalid":
        note(f"error: {kind} {row.get('id')} is invalid: {row.get('error') or 'no reason given'}")
        return EXIT_FAILED
    if status == "pending":
        note(f"error: {kind} {row.get('id')} is still pending validation; see `quantctl {collection} show`")
        return EXIT_FAILED
    return EXIT_OK


def cmd_models_upload(ctx: Context, args: argparse.Namespace) -> int:
    model = upload_checked(ctx, "models", args.file, wait=not args.no_wait)
    emit_json(model)
    return EXIT_OK if args.no_wait and model.get("status") == "pending" else validation_outcome(model)


def cmd_models_list(ctx: Context, args: argparse.Namespace) -> int:
    return _list(ctx, args, "models", {}, MODEL_COLUMNS)


def cmd_models_show(ctx: Context, args: argparse.Namespace) -> int:
    emit_json(ctx.client.get_json(resource_path("models", args.id)))
    return EXIT_OK


def cmd_datasets_upload(ctx: Context, args: argparse.Namespace) -> int:
    """An .npz is ready at once; a zip of images waits for the worker that decodes every image."""
    dataset = upload_checked(ctx, "datasets", args.file)
    emit_json(dataset)
    return validation_outcome(dataset, "datasets")


def cmd_datasets_show(ctx: Context, args: argparse.Namespace) -> int:
    emit_json(ctx.client.get_json(resource_path("datasets", args.id)))
    return EXIT_OK


# ---------------------------------------------------------------- comparison


def _arrow(before: str, after: str) -> str:
    return "" if not before and not after else f"{before or '-'} -> {after or '-'}"


def _fixed(value: Any, digits: int) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else ""


def _recipe_text(recipe: dict[str, Any]) -> str:
    parts = [recipe.get("platform"), recipe.get("precision"), recipe.get("observer"), recipe.get("percentile")]
    if recipe.get("reconstruction"):
        parts.append("reconstruction")
    if recipe.get("target"):
        parts.append("target")
    return " ".join(str(p) for p in parts if p is not None)


def _metric(row: dict[str, Any], key: str) -> Any:
    return (row.get("metrics") or {}).get(key)


COMPARISON_COLUMNS = (
    ("JOB", lambda r: str(r.get("job_id", ""))[:8]),
    ("STATUS", lambda r: r.get("status")),
    ("RECIPE", lambda r: _recipe_text(r.get("recipe") or {})),
    ("TOP1 FP32->Q", lambda r: _arrow(_fixed(_metric(r, "top1_fp32"), 4), _fixed(_metric(r, "top1_quantized"), 4))),
    ("DROP PTS", lambda r: _fixed(_metric(r, "top1_drop"), 2)),
    ("SQNR MIN dB", lambda r: _fixed(_metric(r, "sqnr_db_min"), 2)),
    ("COS MIN", lambda r: _fixed(_metric(r, "cosine_min"), 5)),
    ("SIZE Q", lambda r: (r.get("size") or {}).get("quantized_bytes")),
    (
        "CPU P50 ms FP32->Q",
        lambda r: _arrow(
            _fixed((r.get("latency") or {}).get("fp32_p50_ms"), 3),
            _fixed((r.get("latency") or {}).get("quantized_p50_ms"), 3),
        ),
    ),
)


def cmd_compare(ctx: Context, args: argparse.Namespace) -> int:
    """Every job of one model side by side (GET /models/{id}/comparison)."""
    return _list(ctx, args, f"{resource_path('models', args.model)}/comparison", {}, COMPARISON_COLUMNS)


# ---------------------------------------------------------------- jobs


def _list(ctx: Context, args: argparse.Namespace, path: str, filters: dict[str, Any], columns: Sequence[Any]) -> int:
    items: list[dict[str, Any]] = []
    next_cursor = None
    for page in ctx.client.pages(path, {**filters, "limit": args.limit}, cursor=args.cursor):
        items += page.get("items") or []
        next_cursor = page.get("next_cursor")
        if not args.all:
            break
    if args.json:
        emit_json(items)
    else:
        print_table(items, columns)
    if next_cursor:
        note(f"more results: add --cursor {next_cursor} (or --all)")
    return EXIT_OK


def submit_job(ctx: Context, model_id: str, dataset_id: str, recipe: dict[str, Any]) -> dict[str, Any]:
    return ctx.client.post_json("jobs", {"model_id": model_id, "dataset_id": dataset_id, "recipe": recipe})


def watch_job(ctx: Context, job_id: str) -> int:
    try:
        job = JobWatcher(ctx.client, job_id, progress=ctx.progress).run()
    except KeyboardInterrupt:
        note(f"\nstopped watching; job {job_id} goes on (stop it with `quantctl jobs cancel {job_id}`)")
        raise
    status = job.get("status")
    print(f"job {job_id} {status}")
    if status == "succeeded":
        return EXIT_OK
    note(f"error: job {job_id} {status}" + (f": {job['error']}" if job.get("error") else ""))
    return EXIT_FAILED


def cmd_jobs_submit(ctx: Context, args: argparse.Namespace) -> int:
    job = submit_job(ctx, args.model, args.dataset, build_recipe(args.recipe, args.set))
    emit_json(job)
    return watch_job(ctx, str(job["id"])) if args.watch else EXIT_OK


def cmd_jobs_list(ctx: Context, args: argparse.Namespace) -> int:
    return _list(ctx, args, "jobs", {"status": args.status}, JOB_COLUMNS)


def cmd_jobs_show(ctx: Context, args: argparse.Namespace) -> int:
    emit_json(ctx.client.get_json(job_path(args.id)))
    return EXIT_OK


def cmd_jobs_cancel(ctx: Context, args: argparse.Namespace) -> int:
    emit_json(ctx.client.post_json(job_path(args.id, "cancel")))
    return EXIT_OK


def cmd_jobs_watch(ctx: Context, args: argparse.Namespace) -> int:
    return watch_job(ctx, args.id)


def cmd_jobs_report(ctx: Context, args: argparse.Namespace) -> int:
    report = ctx.client.get_json(job_path(args.id, "report"))
    if args.json:
        emit_json(report)
    else:
        print(render_report(report))
    return EXIT_OK


def download_artifacts(ctx: Context, job_id: str, names: Sequence[str], out_dir: Path) -> list[Path]:
    listing = ctx.client.get_json(job_path(job_id, "artifacts"))
    artifacts = listing.get("items", []) if isinstance(listing, dict) else listing
    available = {str(artifact.get("name")): artifact for artifact in artifacts}
    if missing := [name for name in names if name not in available]:
        raise UsageError(f"job {job_id} has no artifact {', '.join(missing)}; it has: {', '.join(available) or 'none'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names or list(available):
        if Path(name).name != name or name in {".", ".."} or "\\" in name:
            raise DownloadError(f"refusing artifact name {name!r}: not a plain file name")
        artifact, dest = available[name], out_dir / name
        fetched = download(
            ctx.client,
            job_path(job_id, "artifacts", name),
            dest,
            size=artifact.get("size_bytes"),
            sha256=artifact.get("sha256"),
            progress=ctx.progress,
        )
        if not fetched:
            note(f"{dest}: already up to date")
        paths.append(dest)
    return paths


def cmd_jobs_download(ctx: Context, args: argparse.Namespace) -> int:
    for path in download_artifacts(ctx, args.id, args.name, args.output or Path(args.id)):
        print(path)
    return EXIT_OK


# ---------------------------------------------------------------- quantize: the whole round trip


def cmd_quantize(ctx: Context, args: argparse.Namespace) -> int:
    recipe = build_recipe(args.recipe, args.set)  # a bad --set fails before anything is uploaded
    model = upload_checked(ctx, "models", args.model)
    if (code := validation_outcome(model)) != EXIT_OK:
        return code
    note(f"model {model['id']} {model['status']}")
    dataset = upload_checked(ctx, "datasets", args.data)
    if (code := validation_outcome(dataset, "datasets")) != EXIT_OK:
        return code
    note(f"dataset {dataset['id']}: {dataset.get('num_samples') or 'per-input'} samples")
    job = submit_job(ctx, str(model["id"]), str(dataset["id"]), recipe)
    job_id = str(job["id"])
    note(f"job {job_id} {job.get('status', 'queued')}")
    if (code := watch_job(ctx, job_id)) != EXIT_OK:
        return code
    paths = download_artifacts(ctx, job_id, [], args.output or Path(job_id))
    print()
    print(render_report(ctx.client.get_json(job_path(job_id, "report"))))
    print()
    print("artifacts:")
    for path in paths:
        print(f"  {path}")
    return EXIT_OK


# ---------------------------------------------------------------- arguments


def existing_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {value}")
    return path


def build_parser() -> argparse.ArgumentParser:
    # Global options live on every parser, with SUPPRESS defaults so a later position does not reset them.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help=f"API base URL (env QUANT_API_URL; {DEFAULT_URL})")
    common.add_argument("--api-key", default=argparse.SUPPRESS, help="API key (env QUANT_API_KEY)")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help="HTTP timeout in seconds (60)")
    common.add_argument("--no-progress", action="store_true", default=argparse.SUPPRESS, help="no progress bars")

    parser = argparse.ArgumentParser(
        prog="quantctl", parents=[common], description="Client of the ONNX quantization service."
    )
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")

    def command(sub: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        leaf = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        leaf.set_defaults(handler=handler)
        return leaf

    def listing(leaf: argparse.ArgumentParser) -> None:
        leaf.add_argument("--limit", type=int, help="page size")
        leaf.add_argument("--cursor", help="start at this cursor (from a previous page)")
        leaf.add_argument("--all", action="store_true", help="follow the cursor through every page")
        leaf.add_argument("--json", action="store_true", help="print the items as JSON")

    def recipe_options(leaf: argparse.ArgumentParser) -> None:
        leaf.add_argument("--recipe", type=Path, help="recipe JSON file")
        leaf.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a recipe field, e.g. calibration.observer=minmax (repeatable; JSON values)",
        )

    models = groups.add_parser("models", help="upload and inspect ONNX models").add_subparsers(
        dest="command", required=True, metavar="ACTION"
    )
    leaf = command(models, "upload", cmd_models_upload, "upload an ONNX model and wait for its validation")
    leaf.add_argument("file", type=existing_file)
    leaf.add_argument("--no-wait", action="store_true", help="do not wait for a pending validation")
    listing(command(models, "list", cmd_models_list, "list models"))
    command(models, "show", cmd_models_show, "show one model").add_argument("id")

    datasets = groups.add_parser("datasets", help="upload and inspect calibration data").add_subparsers(
        dest="command", required=True, metavar="ACTION"
    )
    command(
        datasets, "upload", cmd_datasets_upload, "upload an .npz of named input arrays, or a zip of JPEG/PNG images"
    ).add_argument("file", type=existing_file)
    command(datasets, "show", cmd_datasets_show, "show one dataset").add_argument("id")

    jobs = groups.add_parser("jobs", help="submit, follow and collect quantization jobs").add_subparsers(
        dest="command", required=True, metavar="ACTION"
    )
    leaf = command(jobs, "submit", cmd_jobs_submit, "submit a quantization job")
    leaf.add_argument("--model", required=True, help="model id")
    leaf.add_argument("--dataset", required=True, help="dataset id")
    recipe_options(leaf)
    leaf.add_argument("--watch", action="store_true", help="follow the job until it ends")
    leaf = command(jobs, "list", cmd_jobs_list, "list jobs, newest first")
    leaf.add_argument("--status", help="queued, running, canceling, succeeded, failed or canceled")
    listing(leaf)
    command(jobs, "show", cmd_jobs_show, "show one job").add_argument("id")
    command(jobs, "cancel", cmd_jobs_cancel, "ask a job to stop").add_argument("id")
    command(jobs, "watch", cmd_jobs_watch, "follow a job's progress; exit 0 when it succeeds").add_argument("id")
    leaf = command(jobs, "report", cmd_jobs_report, "summarize a finished job's report")
    leaf.add_argument("id")
    leaf.add_argument("--json", action="store_true", help="print the raw report")
    leaf = command(jobs, "download", cmd_jobs_download, "download a job's artifacts")
    leaf.add_argument("id")
    leaf.add_argument("--name", action="append", default=[], metavar="ARTIFACT", help="only this artifact (repeatable)")
    leaf.add_argument("-o", "--output", type=Path, help="directory (default: ./JOB_ID)")

    leaf = command(groups, "compare", cmd_compare, "compare every job of one model: recipe, accuracy, size, latency")
    leaf.add_argument("model", help="model id")
    listing(leaf)

    leaf = command(groups, "quantize", cmd_quantize, "upload, quantize, watch and download in one go")
    leaf.add_argument("model", type=existing_file, help="FP32 ONNX model")
    leaf.add_argument("data", type=existing_file, help="calibration data (.npz, or a zip of images)")
    recipe_options(leaf)
    leaf.add_argument("-o", "--output", type=Path, help="directory for the artifacts (default: ./JOB_ID)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    url = getattr(args, "url", None) or os.environ.get("QUANT_API_URL") or DEFAULT_URL
    api_key = getattr(args, "api_key", None) or os.environ.get("QUANT_API_KEY")
    client = Client(url, api_key, timeout=getattr(args, "timeout", 60.0))
    ctx = Context(client=client, progress=False if getattr(args, "no_progress", False) else None)
    try:
        return args.handler(ctx, args)
    except ApiError as exc:
        note(exc.render())
    except (RecipeError, UsageError) as exc:
        note(f"quantctl: error: {exc}")
        return EXIT_USAGE
    except DownloadError as exc:
        note(f"error: download failed: {exc}")
    except ProtocolError as exc:
        note(f"error: {exc}")
    except httpx.TransportError as exc:
        note(f"error: cannot talk to the API at {client.base_url}: {exc or type(exc).__name__}")
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        client.close()
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
