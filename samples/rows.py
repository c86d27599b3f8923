"""Database rows for tests and benchmarks that need jobs without running them."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from jobs import queries, uploaded


def placeholder_job(*, session: Session, project_id: uuid.UUID, recipe: dict, count: int = 1) -> list[uuid.UUID]:
    """``count`` queued jobs of ``project_id`` on a placeholder model and dataset: rows only, the files
    they name do not exist, so nothing may run them."""
    model_id, dataset_id = uuid.uuid4(), uuid.uuid4()
    uploaded.create_model(
        session=session,
        project_id=project_id,
        model_id=model_id,
        filename="m.onnx",
        sha256="0" * 64,
        size_bytes=1,
        path="m.onnx",
    )
    uploaded.create_dataset(
        session=session,
        project_id=project_id,
        dataset_id=dataset_id,
        filename="d.npz",
        sha256="0" * 64,
        size_bytes=1,
        path="d.npz",
        arrays=[{"name": "x", "dtype": "float32", "shape": [32, 3, 8, 8]}],
        num_samples=32,
    )
    return [
        queries.create_job(
            session=session, project_id=project_id, model_id=model_id, dataset_id=dataset_id, recipe=recipe
        ).id
        for _ in range(count)
    ]
