import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

COMPOSE = Path(__file__).parents[1] / "docker-compose.yml"


@pytest.mark.fast
def test_compose_has_every_service_and_a_gpu_worker():
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert {"postgres", "redis", "minio", "minio-init", "migrate", "worker", "flower"} <= set(services)
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    env = services["worker"]["environment"]
    assert env["BATCHINFER_STORAGE_URL"].startswith("s3://") and env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert "mc mb" in services["minio-init"]["command"][0]
    assert services["api"]["command"][0] == "serve" and "8000:8000" in services["api"]["ports"]
    assert services["api"]["environment"] == env  # the API reads the same settings as the workers


def test_compose_file_passes_docker_compose_config():
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        command = ["docker", "compose"]
    elif shutil.which("docker-compose"):
        command = ["docker-compose"]
    else:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed; the YAML test above still ran")
    result = subprocess.run([*command, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
