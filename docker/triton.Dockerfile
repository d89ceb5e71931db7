# Images for docker-compose.yml. Both stages start FROM the one pinned NGC tritonserver tag that
# docker-compose.yml passes in (x-triton-image), so a TensorRT plan built by `builder` is built
# with exactly the TensorRT library that `triton` loads it with.
#
#   serve   : tritonserver + the few packages the Python-backend models import
#   builder : serve + this project (CPU torch) + the tensorrt Python module matching the image
# The default is the pin of docker-compose.yml (x-triton-image), by digest:
# nvcr.io/nvidia/tritonserver:25.08-py3
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver@sha256:f836551575df7c9fb71144073845c6b3911de57db91a8c95e0687a4d2ac9f7a5
FROM ${TRITON_IMAGE} AS serve

# The NGC images are Ubuntu 24.04 with Python 3.12, whose pip refuses system installs (PEP 668);
# this container is the Python backend's environment, so installing into it is the point.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# tini: PID 1 of the Kubernetes pod (reaps orphans, forwards signals); busybox-static: the one
# binary of the model-repository artifact (tools deploy package copies it from this image).
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        tini busybox-static \
 && rm -rf /var/lib/apt/lists/*
# Exactly the files of docker/requirements-serve.lock, each checked against its sha256
# (scripts/lock-requirements.sh).
COPY docker/requirements-serve.lock /tmp/requirements-serve.lock
RUN python3 -m pip install --require-hashes --no-deps -r /tmp/requirements-serve.lock \
 && rm /tmp/requirements-serve.lock
# The TensorRT guard (standard library only), the healthcheck and the watchdog with per-model
# recovery (tools/process.py, tools/serve/health.py, model_control.py, recovery.py), run by the
# triton service, and the front's admission controller the watchdog runs beside tritonserver
# (tools/front/controller.py and admission.py, standard library only); and the OpenAI/TEI gateway
# (tools/api with the command edge it uses, tools/command.py and tools/net.py), which the
# compose `api` service and the Kubernetes gateway Deployment run: python3 -m tools.api.
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
COPY pyproject.toml README.md* repository.yaml* ./
COPY tools ./tools
COPY backends ./backends
COPY loadtests ./loadtests
# Every file of docker/requirements-builder.lock (the project's dependencies and `load` extra,
# resolved for this Python 3.12, torch's own requirements, the serving packages at the versions
# above), each checked against its sha256; then the CPU build of torch the CPU builder runs
# (docker/requirements-builder-torch.txt, from PyTorch's CPU index: the builder exports ONNX on
# the CPU and TensorRT does the GPU work; PyPI's torch is a multi-GB CUDA build). pip checks its
# hashes when that file has them (scripts/lock_requirements.py says when it cannot). Editable,
# so `tools` finds backends/ here.
COPY docker/requirements-builder.lock docker/requirements-builder-torch.txt /tmp/
COPY scripts/constraints-cpu.txt /tmp/constraints-cpu.txt
RUN python3 -m pip install --require-hashes --no-deps -r /tmp/requirements-builder.lock \
 && python3 -m pip install --no-deps --index-url https://download.pytorch.org/whl/cpu \
        -r /tmp/requirements-builder-torch.txt \
 && python3 -m pip install --no-deps --no-build-isolation -e . \
 && rm /tmp/requirements-builder.lock /tmp/requirements-builder-torch.txt
# TensorRT's Python module over this image's own libnvinfer, so a plan is built by the library
# tritonserver loads it with: only the bindings wheel of the image's TensorRT version and CUDA
# major (`tensorrt-cu13-bindings==10.13.2.*` on 25.08; no dependencies, no second TensorRT), and
# cuda-python of that CUDA major for the parity check's device memory (torch here is CPU-only).
# The full tensorrt-cu13 wheels before the .post1 rebuilds of November 2025 depend on
# nvidia-cuda-runtime-cu13, a stub that refuses to install. The requirements come from the
# serving guard's probe (tests/test_gpu_pins.py runs these lines against recorded PyPI metadata).
RUN python3 -m tools.serve.trt_guard --builder-requirements > /tmp/requirements-tensorrt.txt \
 && echo "installing, to match this image: $(tr '\n' ' ' < /tmp/requirements-tensorrt.txt)" \
 && python3 -m pip install -c /tmp/constraints-cpu.txt -r /tmp/requirements-tensorrt.txt \
 && python3 -m tools.serve.trt_guard --check-module \
 && rm /tmp/requirements-tensorrt.txt
# NGC's entrypoint sets up CUDA forward compatibility (older data-center drivers) before the
# command runs, as for the triton service; images without it (the CPU test images) run the
# command directly. NVIDIA_ENTRYPOINT only moves it for tests.
ENTRYPOINT ["/bin/sh", "-c", "nv=\"${NVIDIA_ENTRYPOINT:-/opt/nvidia/nvidia_entrypoint.sh}\"; if [ -x \"$nv\" ]; then exec \"$nv\" \"$@\"; fi; exec \"$@\"", "builder-entrypoint"]
CMD ["tools", "--help"]
