"""Validate an uploaded model (quantcore; a zip of one with its external data is unpacked first,
`jobs.model_archives`) or image dataset (every image decoded) and record the verdict.

Idempotent: a row is checked only while `pending`, and the verdict is written only onto a row still
pending, so a re-sent message (`worker.reaper`) or a redelivered one never changes a decided row.
"""

from __future__ import annotations

import logging
import uuid

from jobs import uploaded
from jobs.archives import InvalidImageArchive, archive_limits, inspect_image_zip
from jobs.config import settings
from jobs.db import session_scope
from jobs.model_archives import InvalidModelArchive, inspect_model_zip, is_zip, model_archive_limits, unpack_model_zip
from jobs.models import DatasetStatus, ModelStatus
from jobs.storage import open_store
from quantcore import inspect_model
from quantcore.errors import InvalidDataError, InvalidModelError
from worker.images import verify_images
from worker.inputs import check_in, checkout

log = logging.getLogger(__name__)


def validate_model(model_id: uuid.UUID) -> None:
    url = settings.resolved_database_url
    with session_scope(url) as session:
        model = uploaded.get_model_unscoped(session=session, model_id=model_id)
        if model is None or model.status != ModelStatus.pending:
            return  # discarded meanwhile, or decided by an earlier delivery of this check
        key = model.path
    info, error = None, None
    store = open_store(settings)
    try:
        with checkout(store, key, settings.var_dir / "scratch") as path:
            if is_zip(path):  # the model with its external data (checked at upload; re-read, then unpacked)
                unpack_model_zip(path, inspect_model_zip(path, limits=model_archive_limits(settings)))
                check_in(store, path, key)
            info = inspect_model(path, min_opset=settings.min_opset, max_opset=settings.max_opset)
    except (InvalidModelError, InvalidModelArchive) as exc:
        error = str(exc)
    except Exception as exc:  # a validator crash must still end in a verdict, never a stuck 'pending'
        log.exception("validation of model %s crashed", model_id)
        error = f"the model could not be read ({type(exc).__name__}: {exc})"
    with session_scope(url) as session:
        if not uploaded.record_model_validation(session=session, model_id=model_id, info=info, error=error):
            log.info("model %s was decided while this check ran; its verdict is kept", model_id)


def validate_dataset(dataset_id: uuid.UUID) -> None:
    """Re-read an image dataset's listing and decode every image once; record ready or the first error."""
    url = settings.resolved_database_url
    with session_scope(url) as session:
        dataset = uploaded.get_dataset_unscoped(session=session, dataset_id=dataset_id)
        if dataset is None or dataset.status != DatasetStatus.pending:
            return  # discarded meanwhile, or decided by an earlier delivery of this check
        key = dataset.path
    error = None
    try:
        with checkout(open_store(settings), key, settings.var_dir / "scratch") as path:
            listing = inspect_image_zip(path, limits=archive_limits(settings))
            verify_images(path, listing.files, max_pixels=settings.max_image_pixels)
    except (InvalidImageArchive, InvalidDataError) as exc:
        error = str(exc)
    except Exception as exc:  # a validator crash must still end in a verdict, never a stuck 'pending'
        log.exception("validation of dataset %s crashed", dataset_id)
        error = f"the archive could not be read ({type(exc).__name__}: {exc})"
    with session_scope(url) as session:
        if not uploaded.record_dataset_validation(session=session, dataset_id=dataset_id, error=error):
            log.info("dataset %s was decided while this check ran; its verdict is kept", dataset_id)
