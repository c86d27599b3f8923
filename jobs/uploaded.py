"""Models and datasets: every read and write of the uploaded inputs' rows, keyword-only, for API and worker
(the conventions of ``jobs.queries``: the caller owns the transaction).

A project holds one row per upload, unless it uploads bytes it holds already (``find_reusable``: the same
SHA-256 in a model or dataset that validated), which the API answers with the row it has.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from jobs.cursors import paginate
from jobs.models import Dataset, DatasetKind, DatasetStatus, Model, ModelStatus

Stored = TypeVar("Stored", Model, Dataset)

def create_model(
    *,
    session: Session,
    project_id: uuid.UUID,
    model_id: uuid.UUID,
    filename: str,
    sha256: str,
    size_bytes: int,
    path: str,
) -> Model:
    model = Model(
        id=model_id, project_id=project_id, filename=filename, sha256=sha256, size_bytes=size_bytes, path=path
    )
    session.add(model)
    session.flush()
    return model


def get_model(*, session: Session, project_id: uuid.UUID, model_id: uuid.UUID) -> Model | None:
    return session.scalar(select(Model).where(Model.id == model_id, Model.project_id == project_id))


def get_model_unscoped(*, session: Session, model_id: uuid.UUID) -> Model | None:
    """For the worker, which acts on ids it was handed by the API (already scoped)."""
    return session.get(Model, model_id)


def list_models(
    *, session: Session, project_id: uuid.UUID, limit: int, cursor: str | None
) -> tuple[list[Model], str | None]:
    query = select(Model).where(Model.project_id == project_id)
    return paginate(session=session, query=query, entity=Model, limit=limit, cursor=cursor)


def record_model_validation(
    *, session: Session, model_id: uuid.UUID, info: dict[str, Any] | None, error: str | None
) -> bool:
    """Record the verdict on a pending model. False, changing nothing, when it was decided already: a
    re-sent validation's second run, or the reaper gave up on it (`jobs.revalidation`), or it is gone."""
    status = ModelStatus.ready if error is None else ModelStatus.invalid
    return _record_verdict(session=session, entity=Model, row_id=model_id, status=status, info=info, error=error)


def find_reusable(*, session: Session, entity: type[Stored], project_id: uuid.UUID, sha256: str) -> Stored | None:
    """The project's newest ready model (or dataset) whose upload had this SHA-256: what an upload of
    the same bytes is answered with instead of a copy. Pending and invalid ones are not offered."""
    query = select(entity).where(
        entity.project_id == project_id, entity.sha256 == sha256, entity.status == ModelStatus.ready
    )
    return session.scalar(query.order_by(entity.created_at.desc()).limit(1))


def largest_reusable(*, session: Session, entity: type[Stored], project_id: uuid.UUID) -> int:
    """The size of the project's largest ready model (or dataset): no upload `find_reusable` answers
    with a row is larger (its size is the upload's, or more once unpacked)."""
    query = select(func.max(entity.size_bytes)).where(
        entity.project_id == project_id, entity.status == ModelStatus.ready
    )
    return int(session.scalar(query) or 0)


def delete_model(*, session: Session, model: Model) -> None:
    session.delete(model)
    session.flush()


def create_dataset(
    *,
    session: Session,
    project_id: uuid.UUID,
    dataset_id: uuid.UUID,
    filename: str,
    sha256: str,
    size_bytes: int,
    path: str,
    arrays: list[dict[str, Any]],
    num_samples: int | None,
    kind: DatasetKind = DatasetKind.arrays,
    images: dict[str, Any] | None = None,
) -> Dataset:
    """An `.npz` dataset is ready at once; an image dataset waits (`pending`) for its validation task."""
    dataset = Dataset(
        id=dataset_id,
        project_id=project_id,
        filename=filename,
        sha256=sha256,
        size_bytes=size_bytes,
        path=path,
        arrays=arrays,
        num_samples=num_samples,
        kind=kind,
        status=DatasetStatus.ready if kind == DatasetKind.arrays else DatasetStatus.pending,
        images=images,
    )
    session.add(dataset)
    session.flush()
    return dataset


def get_dataset(*, session: Session, project_id: uuid.UUID, dataset_id: uuid.UUID) -> Dataset | None:
    return session.scalar(select(Dataset).where(Dataset.id == dataset_id, Dataset.project_id == project_id))


def get_dataset_unscoped(*, session: Session, dataset_id: uuid.UUID) -> Dataset | None:
    """For the worker, which acts on ids it was handed by the API (already scoped)."""
    return session.get(Dataset, dataset_id)


def record_dataset_validation(*, session: Session, dataset_id: uuid.UUID, error: str | None) -> bool:
    """Record the verdict on a pending image dataset; False as for `record_model_validation`."""
    status = DatasetStatus.ready if error is None else DatasetStatus.invalid
    return _record_verdict(session=session, entity=Dataset, row_id=dataset_id, status=status, error=error)


def _record_verdict(*, session: Session, entity: type[Model] | type[Dataset], row_id: uuid.UUID, **values: Any) -> bool:
    result = session.execute(
        update(entity)
        .where(entity.id == row_id, entity.status == ModelStatus.pending)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1


def delete_dataset(*, session: Session, dataset: Dataset) -> None:
    session.delete(dataset)
    session.flush()


def list_datasets(
    *, session: Session, project_id: uuid.UUID, limit: int, cursor: str | None
) -> tuple[list[Dataset], str | None]:
    query = select(Dataset).where(Dataset.project_id == project_id)
    return paginate(session=session, query=query, entity=Dataset, limit=limit, cursor=cursor)


