"""The health probe (tools/serve/health.py) without a server: requests, probe files, verdicts.

The probe against real servers is in test_serve_server.py and test_compose_triton_server.py;
here the compose healthcheck and watchdog also run from the files the serving image copies.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from server_helpers import copy_serving_stage
from tools.errors import UserInputError
from tools.serve import health

ROOT = Path(__file__).resolve().parents[1]
TOY_REPOSITORY = Path(__file__).parent / "fixtures" / "toy_repository"


def _unused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_probe_request_has_one_row_of_zeros_or_health_strings_per_required_input():
    config = {
        "max_batch_size": 8,
        "input": [
            {"name": "TEXT", "data_type": "TYPE_STRING", "dims": ["1"]},
            {"name": "IDS", "data_type": "TYPE_INT64", "dims": ["-1", "2"]},
            {"name": "MASK", "data_type": "TYPE_BOOL", "dims": ["2"]},
            {"name": "DELAY_MS", "data_type": "TYPE_FP32", "dims": ["1"], "optional": True},
        ],
    }

    request = health.probe_request(config)

    assert request == {"inputs": [
        {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["health"]},
        {"name": "IDS", "shape": [1, 1, 2], "datatype": "INT64", "data": [0, 0]},
        {"name": "MASK", "shape": [1, 2], "datatype": "BOOL", "data": [False, False]},
    ]}


def test_probe_request_of_a_model_without_batching_has_no_batch_dimension():
    config = {"max_batch_size": 0, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}]}

    assert health.probe_request(config)["inputs"][0]["shape"] == [3]


def test_infer_inputs_carry_the_probe_files_tensors_as_json():
    probes = json.loads((ROOT / "docker" / "healthcheck_probes.json").read_text())

    (text,) = health.infer_inputs(probes["text_embedding"])
    (ids,) = health.infer_inputs(
        {"inputs": [{"name": "IDS", "datatype": "INT64", "shape": [1, 3], "data": [[1, 2, 3]]}]}
    )

    assert (text.name(), text.datatype(), text.shape()) == ("TEXT", "BYTES", [1, 1])
    assert text._get_tensor()["data"] == ["healthcheck"]
    assert ids._get_tensor()["data"] == [1, 2, 3] and ids.shape() == [1, 3]
    assert np.array(ids._get_tensor()["data"]).dtype == np.int64


def test_infer_inputs_refuse_data_that_does_not_fit_the_shape_naming_the_input():
    request = {"inputs": [{"name": "IDS", "datatype": "INT64", "shape": [1, 3], "data": [1, 2]}]}

    with pytest.raises(UserInputError, match="probe input 'IDS'"):
        health.infer_inputs(request)


def test_read_probes_refuses_a_file_that_is_not_an_object_of_requests(tmp_path):
    bad = tmp_path / "probes.json"
    bad.write_text('["text_embedding"]')

    with pytest.raises(UserInputError, match=f"probe file {bad}: expected an object"):
        health.read_probes(bad)
    assert health.read_probes(None) == {}


def test_read_probes_refuses_a_request_whose_data_does_not_fit_naming_file_and_model(tmp_path):
    bad = tmp_path / "probes.json"
    bad.write_text(json.dumps({"toy_text": {"inputs": [
        {"name": "TEXT", "datatype": "BYTES", "shape": [1, 2], "data": ["one"]}]}}))

    with pytest.raises(UserInputError) as caught:
        health.read_probes(bad)

    assert str(caught.value).startswith(f"probe file {bad}: model 'toy_text': probe input 'TEXT'")


def test_repository_models_are_the_folders_holding_a_config():
    assert health.repository_models(TOY_REPOSITORY) == ["toy_classify", "toy_double", "toy_text"]


def test_check_of_a_server_that_does_not_answer_is_unhealthy_with_one_problem():
    url = _unused_url()

    report = health.check(url, ["toy_text"], timeout_s=2)

    assert not report.healthy
    assert report.problems == [report.server_problem]
    host_port = url.removeprefix("http://")
    assert report.server_problem.startswith(f"server at {host_port} does not answer")


def test_a_model_is_alive_only_without_a_problem():
    report = health.HealthReport("h:1", (health.ModelHealth("a", probed=True),
                                          health.ModelHealth("b", True, "model 'b' failed")))

    assert [m.alive for m in report.models] == [True, False]
    assert report.problems == ["model 'b' failed"] and not report.healthy


# --- docker/healthcheck.py and docker/triton_supervisor.py as the serving image holds them


@pytest.fixture
def image_layout(tmp_path) -> tuple[Path, dict[str, str]]:
    """/opt/triton-forge as the image has it, and an environment without the checkout.

    ``-S`` keeps the editable install's path hook out; site-packages stands in for the
    packages docker/requirements-serve.txt installs.
    """
    opt = copy_serving_stage(tmp_path / "opt" / "triton-forge")
    site = sysconfig.get_paths()["purelib"]
    return opt, {"PATH": os.environ["PATH"], "PYTHONPATH": site}


def test_healthcheck_runs_from_the_files_the_serving_image_copies(image_layout, tmp_path):
    opt, env = image_layout
    url = _unused_url()

    result = subprocess.run(
        [sys.executable, "-S", str(opt / "docker" / "healthcheck.py"), "--url", url,
         "--repository", str(TOY_REPOSITORY), "--probes",
         str(opt / "docker" / "healthcheck_probes.json")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )

    assert "No module named" not in result.stderr, result.stderr
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"unhealthy: server at {url.removeprefix('http://')} does not answer: "
        "[Errno 111] Connection refused"
    ]


def test_watchdog_runs_from_the_files_the_serving_image_copies(image_layout, tmp_path):
    opt, env = image_layout

    result = subprocess.run(
        [sys.executable, "-S", str(opt / "docker" / "triton_supervisor.py"), "--url",
         _unused_url(), "--repository", str(TOY_REPOSITORY), "--interval", "0.2",
         "--start-timeout", "1", "--stop-timeout", "5", "--", "sleep", "60"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )

    assert "No module named" not in result.stderr, result.stderr
    assert result.returncode == 1
    assert "not healthy after 1s: server at" in result.stderr


@pytest.mark.parametrize("mode", ["liveness", "readiness"])
def test_the_kubernetes_probes_run_from_the_files_the_serving_image_copies(image_layout, tmp_path, mode):
    opt, env = image_layout
    url = _unused_url()

    result = subprocess.run(
        [sys.executable, "-S", str(opt / "docker" / "healthcheck.py"), "--mode", mode, "--url", url,
         "--repository", str(TOY_REPOSITORY), "--probes",
         str(opt / "docker" / "healthcheck_probes.json"), "--status-url", f"{url}/status",
         "--timeout", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )

    assert "No module named" not in result.stderr, result.stderr
    assert result.returncode == 1 and "/v2/health/live" in result.stderr
    assert result.stdout.strip() == f"{mode}: fail"


def test_the_repository_verifier_runs_from_the_files_the_serving_image_copies(image_layout, tmp_path):
    opt, env = image_layout

    result = subprocess.run(
        [sys.executable, "-S", str(opt / "docker" / "verify_repository.py"), "--repository",
         str(TOY_REPOSITORY)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )

    assert "No module named" not in result.stderr, result.stderr
    assert result.returncode in (0, 1) and "verify:" in result.stdout + result.stderr
