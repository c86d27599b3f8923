# syntax=docker/dockerfile:1
#
# Images of the quantization service, one target each:
#
#   api         FastAPI + Alembic. No torch, no onnx: the build fails if an extra pulled them in.
#   worker-cpu  Celery worker for the `default` and `gpu` queues on a CPU machine: onnx, onnxruntime,
#               torch (CPU build from the PyTorch CPU index).
#   worker-gpu  Celery worker for the `engine` and `gpu` queues: CUDA runtime image, torch CUDA build,
#               onnxruntime-gpu, TensorRT (pip). Run it with the NVIDIA container runtime, one per GPU.
#               It builds the TensorRT engines of the jobs it runs and of jobs CPU workers hand off
#               (`engine` queue); it registers what it has (GPU, TensorRT version) at start.
#
#   docker build --target api -t quant-api .
#   docker build --target worker-gpu --build-arg TORCH_CUDA=cu128 -t quant-worker-gpu .
#
# The project is built once into a wheel (stage `wheel`); each runtime image installs that wheel with
# the extra it needs (`.[api]`, `.[worker]`, `.[worker,gpu]`), after torch from the right index. The
# runtime images hold no source tree, build directory or pip cache, and run as the unprivileged user
# `quant` (uid 10001 everywhere, so every service can write the shared /data volume).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04
ARG NODE_IMAGE=node:22-bookworm-slim
# CPU and CUDA builds of the same torch release (pyproject.toml pins torch outside the extras).
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu128

# ---------------------------------------------------------------------------------------------- wheel
# gcc compiles quantcore's C extension (quantcore/observers/_binning.c; the image already has Python's headers).
# It uses no versioned glibc symbol, so the wheel also installs on worker-gpu's Ubuntu base.
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels . && cp constraints.txt /wheels/

# ------------------------------------------------------------------------------------------- frontend
# The dashboard, when the repository has one (frontend/package.json); an empty dist otherwise.
# `fronten[d]` is a glob so that a checkout without the folder still builds; `.dockerignore` always exists.
FROM ${NODE_IMAGE} AS frontend
WORKDIR /frontend
COPY .dockerignore fronten[d] ./
RUN if [ -f package.json ]; then \
        if [ -f package-lock.json ]; then npm ci; else npm install; fi && npm run build && rm -rf node_modules; \
    fi \
    && mkdir -p dist

# -------------------------------------------------------------------------------------- python-base
FROM ${PYTHON_IMAGE} AS python-base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    QUANT_VAR_DIR=/data
RUN python -m venv /opt/venv \
    && groupadd --system --gid 10001 quant \
    && useradd --system --uid 10001 --gid quant --create-home --home-dir /home/quant --shell /usr/sbin/nologin quant \
    && mkdir -p /app /data \
    && chown quant:quant /data
WORKDIR /app

# ------------------------------------------------------------------------------------------------ api
FROM python-base AS api
COPY --from=wheel /wheels /tmp/wheels
RUN pip install -c /tmp/wheels/constraints.txt "$(ls /tmp/wheels/*.whl)[api]" \
    && rm -rf /tmp/wheels \
    && python -c "import importlib.util as u, sys; bad = [m for m in ('torch', 'onnx', 'onnxruntime', 'tensorrt') if u.find_spec(m)]; sys.exit(f'the api image must not contain {bad}' if bad else 0)"
# Alembic reads alembic.ini (or [tool.alembic] in pyproject.toml) and the revisions from the working directory.
COPY pyproject.toml alembic.in[i] ./
COPY migrations ./migrations
COPY --from=frontend /frontend/dist ./frontend/dist
USER quant
EXPOSE 8000
# Migrations run in their own one-shot container (`migrate` in docker-compose.yml): `alembic upgrade head`.
CMD ["python", "-m", "api.serve", "--host", "0.0.0.0", "--port", "8000"]

# ----------------------------------------------------------------------------------------- worker-cpu
FROM python-base AS worker-cpu
ARG TORCH_VERSION
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"
COPY --from=wheel /wheels /tmp/wheels
RUN pip install -c /tmp/wheels/constraints.txt "$(ls /tmp/wheels/*.whl)[worker]" \
    && rm -rf /tmp/wheels \
    && python -c "import onnx, onnxruntime, torch; assert '+cpu' in torch.__version__, torch.__version__"
USER quant
CMD ["celery", "-A", "worker.app", "worker", "--hostname", "cpu@%h", "-Q", "default,gpu", \
     "--concurrency", "1", "--prefetch-multiplier", "1", "--loglevel", "INFO"]

# ----------------------------------------------------------------------------------------- worker-gpu
FROM ${CUDA_IMAGE} AS worker-gpu
ARG TORCH_VERSION
ARG TORCH_CUDA
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    QUANT_VAR_DIR=/data
# Ubuntu 22.04 ships Python 3.10; the project needs 3.11 (deadsnakes builds it for 22.04).
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
    && apt-get purge -y --auto-remove software-properties-common gpg-agent \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/venv \
    && groupadd --system --gid 10001 quant \
    && useradd --system --uid 10001 --gid quant --create-home --home-dir /home/quant --shell /usr/sbin/nologin quant \
    && mkdir -p /app /data \
    && chown quant:quant /data
WORKDIR /app
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" "torch==${TORCH_VERSION}"
COPY --from=wheel /wheels /tmp/wheels
# `worker` brings onnxruntime (CPU) and `gpu` brings onnxruntime-gpu; both own the `onnxruntime` module,
# so the CPU one is removed and the GPU one reinstalled over it, then the CUDA provider is checked.
RUN pip install -c /tmp/wheels/constraints.txt "$(ls /tmp/wheels/*.whl)[worker,gpu]" \
    && rm -rf /tmp/wheels \
    && if pip show --quiet onnxruntime 2>/dev/null; then \
        ort_gpu="$(pip show onnxruntime-gpu | sed -n 's/^Version: //p')" \
        && pip uninstall -y onnxruntime \
        && pip install --force-reinstall --no-deps "onnxruntime-gpu==${ort_gpu}"; \
    fi \
    && python -c "import onnxruntime as ort; p = ort.get_available_providers(); assert 'CUDAExecutionProvider' in p, p" \
    && python -c "import torch; assert torch.version.cuda, torch.__version__" \
    && python -c "import tensorrt; print('TensorRT', tensorrt.__version__)"
USER quant
CMD ["celery", "-A", "worker.app", "worker", "--hostname", "gpu@%h", "-Q", "engine,gpu", \
     "--concurrency", "1", "--prefetch-multiplier", "1", "--loglevel", "INFO"]
