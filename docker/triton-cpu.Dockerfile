# CPU images for docker-compose.cpu.yml, built where no image registry is reachable: FROM a Debian
# root filesystem made on the host (docker/debian-rootfs.sh, imported as BASE_IMAGE), with the
# embedded tritonserver of the nvidia-pytriton wheel (Triton 2.51) in place of the NGC image.
# scripts/compose-images.sh builds them; it fills build/images/wheelhouse (pip download, with
# the host's pip configuration) first, so no step here needs the network.
#
#   tritonserver : what the NGC image gives triton.Dockerfile: /opt/tritonserver/bin/tritonserver,
#                  /opt/tritonserver/backends/python (the wheel's backend and the stub of this
#                  Python), python3 and numpy on PATH
#   serve        : the same packages and files, at the same paths, as triton.Dockerfile `serve`
#   builder      : serve + this project (CPU torch), as triton.Dockerfile `builder` without TensorRT
#
# Triton 2.51 predates the CVE-2025-23319/23320/23334/23310/23311 fixes (25.07): these images are
# for development, CI and trials on loopback; production CPU hosts run the NGC image.
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS tritonserver
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_NO_CACHE_DIR=1 \
    PIP_NO_INDEX=1 \
    PIP_FIND_LINKS=/wheels \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
# Every package from docker/requirements-cpu.lock, each file checked against its sha256
# (scripts/lock-requirements.sh): nvidia-pytriton and what the Python-backend models import.
COPY docker/requirements-cpu.lock /tmp/requirements-cpu.lock
RUN --mount=type=bind,source=build/images/wheelhouse,target=/wheels \
    python3 -m venv /opt/venv \
 && pip install --quiet --require-hashes --no-deps -r /tmp/requirements-cpu.lock \
 && rm /tmp/requirements-cpu.lock \
 && server="$(python3 -c 'import pathlib, pytriton; print(pathlib.Path(pytriton.__file__).parent / "tritonserver")')" \
 && version="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
 && mkdir -p /opt/tritonserver/bin /opt/tritonserver/libexec /opt/tritonserver/backends/python \
 && ln -s "$server/bin/tritonserver" /opt/tritonserver/libexec/tritonserver \
 && ln -s "$server/backends/python/libtriton_python.so" \
          "$server/backends/python/triton_python_backend_utils.py" \
          "$server/python_backend_stubs/$version/triton_python_backend_stub" \
          /opt/tritonserver/backends/python/ \
 && { /opt/tritonserver/libexec/tritonserver --help 2>&1 || true; } | grep -q -- --model-repository
# Triton's default --backend-directory is /opt/tritonserver/backends, as in the NGC image.
COPY docker/tritonserver-cpu.sh /opt/tritonserver/bin/tritonserver
ENV PATH=/opt/tritonserver/bin:${PATH}

FROM tritonserver AS serve
# (The serving packages came with the lock above.)
# The TensorRT guard (standard library only), the healthcheck and the watchdog with per-model
# recovery (tools/process.py, tools/serve/health.py, model_control.py, recovery.py), run by the
# triton service, and the front's admission controller the watchdog runs beside tritonserver
# (tools/front/controller.py and admission.py, standard library only); and the OpenAI/TEI gateway
# (tools/api with the command edge it uses, tools/command.py and tools/net.py), which the
# compose `api` service and the Kubernetes gateway Deployment run: python3 -m tools.api. Keep
# these COPY lines the same as triton.Dockerfile's serve stage (tests/test_compose_cpu.py checks it).
COPY tools/__init__.py tools/errors.py tools/process.py tools/files.py tools/manifest.py tools/tensorrt_module.py \
     tools/command.py tools/net.py /opt/triton-forge/tools/
COPY tools/serve/__init__.py tools/serve/trt_guard.py tools/serve/health.py tools/serve/model_control.py \
     tools/serve/recovery.py tools/serve/server_log.py tools/serve/probes.py /opt/triton-forge/tools/serve/
COPY tools/front/ /opt/triton-forge/tools/front/
COPY tools/api/ /opt/triton-forge/tools/api/
COPY tools/deploy/__init__.py tools/deploy/verify.py /opt/triton-forge/tools/deploy/
COPY docker/triton-entrypoint.sh docker/triton_supervisor.py docker/healthcheck.py \
     docker/healthcheck_probes.json docker/verify_repository.py \
     /opt/triton-forge/docker/

FROM serve AS builder
WORKDIR /opt/triton-forge
# Dependencies first (a layer that survives source changes), then the project, editable, so
# `tools` finds backends/ here: every file of docker/requirements-builder-cpu.lock (the project's
# dependencies and `load` extra from pyproject.toml, CPU torch, setuptools and wheel for the
# editable install; the serving packages at the versions above), each checked against its sha256.
COPY docker/requirements-builder-cpu.lock /tmp/requirements-builder-cpu.lock
RUN --mount=type=bind,source=build/images/wheelhouse,target=/wheels \
    pip install --quiet --require-hashes --no-deps -r /tmp/requirements-builder-cpu.lock \
 && rm /tmp/requirements-builder-cpu.lock
COPY pyproject.toml README.md* repository.yaml* ./
COPY tools ./tools
COPY backends ./backends
COPY loadtests ./loadtests
RUN pip install --quiet --no-deps --no-build-isolation -e . && tools --version
ENTRYPOINT []
CMD ["tools", "--help"]
