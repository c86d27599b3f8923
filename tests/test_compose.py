"""docker-compose.yml as docker-compose resolves it, and a static reading of the Dockerfile.

No Docker engine is needed: `docker-compose config` only parses, interpolates and validates the file.
The compose tests skip when neither `docker-compose` (the Debian package CI installs) nor the
`docker compose` plugin is present; the Dockerfile tests always run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENT = {
    "DATABASE_URL": "postgresql+psycopg://quant:quant@postgres:5432/quant",
    "BROKER_URL": "redis://redis:6379/0",
    "QUANT_ENVIRONMENT": "production",
    "QUANT_VAR_DIR": "/data",
    "QUANT_STORAGE_URL": "s3://quant/store",
    "QUANT_STORAGE_ENDPOINT_URL": "http://minio:9000",
    "AWS_ACCESS_KEY_ID": "quant",
    "AWS_SECRET_ACCESS_KEY": "quant-store-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
RUNTIME_TARGETS = ("api", "worker-cpu", "worker-gpu")
ENGINE_PACKAGES = ("torch", "onnx", "onnxruntime", "tensorrt")


# ---------------------------------------------------------------- docker-compose.yml


def _compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the resolved compose file")
    command = _compose_command()
    if command is None:
        pytest.skip(
            "neither docker-compose nor the docker compose plugin is installed (apt-get install docker-compose)"
        )
    # Neither the caller's environment nor a developer's .env may set POSTGRES_PASSWORD: check the defaults.
    env = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
    empty_env_file = tmp_path_factory.mktemp("compose") / "empty.env"
    empty_env_file.write_text("")
    result = subprocess.run(
        [*command, "--env-file", str(empty_env_file), "-f", "docker-compose.yml", "--profile", "gpu", "config"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def _depends(service: dict[str, Any]) -> dict[str, str]:
    depends = service.get("depends_on", {})
    return {name: (spec or {}).get("condition", "service_started") for name, spec in depends.items()}


def _command(service: dict[str, Any]) -> str:
    command = service.get("command", [])
    return " ".join(command) if isinstance(command, list) else command


def test_services(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {
        "postgres", "redis", "minio", "bucket", "migrate", "api", "worker-cpu", "beat", "worker-gpu"
    }  # fmt: skip
    assert {"pgdata", "redisdata", "artifacts", "objects"} <= set(compose["volumes"])


def test_databases_have_healthchecks_and_volumes(compose: dict[str, Any]) -> None:
    postgres, redis = compose["services"]["postgres"], compose["services"]["redis"]
    assert postgres["image"] == "postgres:16"
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert any(str(volume).startswith("pgdata:/var/lib/postgresql/data") for volume in _volumes(postgres))
    assert redis["image"] == "redis:7"
    assert redis["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]


def test_migrate_runs_alembic_on_the_api_image_once_postgres_is_healthy(compose: dict[str, Any]) -> None:
    migrate = compose["services"]["migrate"]
    assert _command(migrate) == "alembic upgrade head"
    assert migrate["build"]["target"] == "api"
    assert migrate["image"] == compose["services"]["api"]["image"]
    assert _depends(migrate) == {"postgres": "service_healthy"}
    assert migrate.get("restart") in (None, "no")


def test_api_waits_for_migrations_and_exposes_8000(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    assert api["build"]["target"] == "api"
    assert _depends(api) == {
        "migrate": "service_completed_successfully",
        "bucket": "service_completed_successfully",
        "postgres": "service_healthy",
        "redis": "service_healthy",
    }
    assert [(str(port["published"]), port["target"]) for port in api["ports"]] == [("8000", 8000)]
    assert api["healthcheck"]["test"][0] == "CMD"


@pytest.mark.parametrize("name", ["migrate", "api", "worker-cpu", "worker-gpu"])
def test_services_share_the_settings(compose: dict[str, Any], name: str) -> None:
    assert compose["services"][name]["environment"] == ENVIRONMENT


def test_the_store_is_minio_with_its_bucket_made_before_the_services_start(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["minio"]["image"].startswith("minio/minio:")
    assert services["minio"]["healthcheck"]["test"] == ["CMD", "mc", "ready", "local"]
    assert any(str(volume).startswith("objects:/data") for volume in _volumes(services["minio"]))
    bucket = ENVIRONMENT["QUANT_STORAGE_URL"].removeprefix("s3://").split("/")[0]
    assert f"mc mb --ignore-existing store/{bucket}" in " ".join(services["bucket"]["entrypoint"])
    assert _depends(services["bucket"]) == {"minio": "service_healthy"}
    for name in ("api", "worker-cpu", "worker-gpu", "beat"):
        assert _depends(services[name])["bucket"] == "service_completed_successfully", name


def test_gpu_workers_on_another_host_share_nothing_on_disk(compose: dict[str, Any]) -> None:
    yaml = pytest.importorskip("yaml")
    env = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
    result = subprocess.run(
        [*_compose_command(), "-f", "docker-compose.gpu-host.yml", "config"],
        cwd=ROOT,
        env={**env, "QUANT_MAIN_HOST": "10.0.0.5"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    worker = yaml.safe_load(result.stdout)["services"]["worker-gpu"]
    expected = dict(
        ENVIRONMENT,
        DATABASE_URL="postgresql+psycopg://quant:quant@10.0.0.5:5432/quant",
        BROKER_URL="redis://10.0.0.5:6379/0",
        QUANT_STORAGE_ENDPOINT_URL="http://10.0.0.5:9000",
    )
    assert worker["environment"] == expected
    assert "-Q gpu " in _command(worker)  # whole jobs; engine hand-offs need a disk shared on one host
    assert not any(str(volume).startswith("artifacts:") for volume in _volumes(worker))


@pytest.mark.parametrize("name", ["api", "worker-cpu", "worker-gpu"])
def test_artifacts_volume_is_shared_at_data(compose: dict[str, Any], name: str) -> None:
    assert any(str(volume).startswith("artifacts:/data") for volume in _volumes(compose["services"][name]))


def test_cpu_worker_serves_both_queues_one_message_per_process(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker-cpu"]
    assert worker["build"]["target"] == "worker-cpu"
    command = _command(worker)
    assert command.startswith("celery -A worker.app worker")
    assert "-Q default,gpu" in command
    assert "--concurrency 2" in command and "--prefetch-multiplier 1" in command
    assert _depends(worker) == {
        "migrate": "service_completed_successfully",
        "bucket": "service_completed_successfully",
        "redis": "service_healthy",
    }
    assert "profiles" not in worker


def test_one_beat_schedules_the_reaper(compose: dict[str, Any]) -> None:
    beat = compose["services"]["beat"]
    assert _command(beat).startswith("celery -A worker.app beat")
    assert beat["image"] == compose["services"]["worker-cpu"]["image"]
    assert beat["environment"] == ENVIRONMENT
    assert "deploy" not in beat or beat["deploy"].get("replicas", 1) == 1


def test_gpu_worker_is_opt_in_and_reserves_one_nvidia_gpu(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker-gpu"]
    assert worker["profiles"] == ["gpu"]
    assert worker["build"]["target"] == "worker-gpu"
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert int(device["count"]) == 1
    assert device["capabilities"] == ["gpu"]
    command = _command(worker)
    assert re.search(r"-Q engine,gpu(\s|$)", command)  # TensorRT builds, and whole jobs
    assert "--concurrency 1" in command and "--prefetch-multiplier 1" in command


def test_only_the_gpu_worker_consumes_the_engine_queue(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        command = _command(service)
        if "worker.app worker" in command and name != "worker-gpu":
            queues = re.search(r"-Q (\S+)", command).group(1).split(",")
            assert "engine" not in queues, name


def _volumes(service: dict[str, Any]) -> list[str]:
    """Volume entries as `source:target[:mode]` strings (v1 prints strings, v2 prints mappings)."""
    out = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            volume = f"{volume.get('source')}:{volume.get('target')}"
        out.append(volume)
    return out


# ---------------------------------------------------------------- Dockerfile


def dockerfile_stages(text: str) -> dict[str, dict[str, Any]]:
    """{stage name: {"from": base, "instructions": [(KEYWORD, arguments)]}}, continuations joined,
    comment lines dropped, `${ARG}` in FROM resolved from the ARGs declared before the first FROM."""
    logical, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    global_args: dict[str, str] = {}
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in logical:
        keyword, _, arguments = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and current is None:
            name, _, default = arguments.partition("=")
            global_args[name.strip()] = default.strip()
        elif keyword == "FROM":
            match = re.fullmatch(r"(\S+)\s+AS\s+(\S+)", arguments.strip(), flags=re.IGNORECASE)
            assert match, f"every stage is named: {line}"
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args.get(m.group(1), m.group(0)), match.group(1))
            current = stages[match.group(2)] = {"from": base, "instructions": []}
        elif current is not None:
            current["instructions"].append((keyword, arguments))
    return stages


@pytest.fixture(scope="module")
def stages() -> dict[str, dict[str, Any]]:
    return dockerfile_stages((ROOT / "Dockerfile").read_text())


def _chain(stages: dict[str, dict[str, Any]], name: str) -> list[tuple[str, str]]:
    """The instructions of `name` and of the stages it is built FROM, base first."""
    stage = stages[name]
    inherited = _chain(stages, stage["from"]) if stage["from"] in stages else []
    return inherited + stage["instructions"]


def _pip_installs(instructions: list[tuple[str, str]]) -> list[str]:
    return [
        part for keyword, args in instructions if keyword == "RUN" for part in args.split("&&") if "pip install" in part
    ]


def test_runtime_targets_exist(stages: dict[str, dict[str, Any]]) -> None:
    assert set(RUNTIME_TARGETS) <= set(stages)
    assert stages["worker-gpu"]["from"].startswith("nvidia/cuda:") and "runtime" in stages["worker-gpu"]["from"]
    assert stages["python-base"]["from"].startswith("python:3.11-slim")


def test_api_image_installs_no_engine(stages: dict[str, dict[str, Any]]) -> None:
    installs = _pip_installs(_chain(stages, "api"))
    assert installs, "the api target installs the project"
    for command in installs:
        assert not any(re.search(rf"\b{package}\b", command) for package in ENGINE_PACKAGES), command
    assert any("[api]" in command for command in installs)


def test_workers_install_torch_from_the_pytorch_index_first(stages: dict[str, dict[str, Any]]) -> None:
    cpu = _pip_installs(_chain(stages, "worker-cpu"))
    assert "download.pytorch.org/whl/cpu" in cpu[0] and "torch==" in cpu[0]
    assert "[worker]" in cpu[1]
    gpu = _pip_installs(_chain(stages, "worker-gpu"))
    assert "download.pytorch.org/whl/${TORCH_CUDA}" in gpu[0]
    assert any("[worker,gpu]" in command for command in gpu)


@pytest.mark.parametrize("target", RUNTIME_TARGETS)
def test_runtime_images_run_unprivileged(stages: dict[str, dict[str, Any]], target: str) -> None:
    users = [args.strip() for keyword, args in _chain(stages, target) if keyword == "USER"]
    assert users and users[-1] not in ("root", "0")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("api", "python -m api.serve --host 0.0.0.0 --port 8000"),
        ("worker-cpu", "-Q default,gpu --concurrency 1 --prefetch-multiplier 1"),
        ("worker-gpu", "-Q engine,gpu --concurrency 1 --prefetch-multiplier 1"),
    ],
)
def test_commands(stages: dict[str, dict[str, Any]], target: str, expected: str) -> None:
    (cmd,) = [args for keyword, args in stages[target]["instructions"] if keyword == "CMD"]
    assert expected in " ".join(re.findall(r'"([^"]*)"', cmd))


def test_run_instructions_are_valid_shell(stages: dict[str, dict[str, Any]]) -> None:
    shell = shutil.which("sh")
    if shell is None:
        pytest.skip("no POSIX shell to check the RUN lines with")
    for name, stage in stages.items():
        for keyword, args in stage["instructions"]:
            if keyword == "RUN" and not args.lstrip().startswith("["):
                result = subprocess.run([shell, "-n", "-c", args], capture_output=True, text=True)
                assert result.returncode == 0, f"{name}: {args}\n{result.stderr}"


def test_dockerignore_keeps_local_state_and_secrets_out() -> None:
    patterns = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", "var", "**/node_modules", ".env", ".git", ".pytest_cache", ".ruff_cache"} <= patterns
