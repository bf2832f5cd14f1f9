# The function runtime for CPU instances: Python, PyTorch (CPU build) and Dilu's instance server.
# The docker runtime backend starts one container per instance from it, as an unprivileged user
# with a read-only root filesystem; the function's code is mounted at /opt/dilu/function.
#   docker build -f docker/runtime-cpu.Dockerfile -t dilu/runtime-cpu .
# A function image (`image:` in model.yaml) is this image with the handler added:
#   FROM dilu/runtime-cpu
#   COPY . /opt/app
#   WORKDIR /opt/app
# Build arguments: BASE_IMAGE (Python 3.11+ with venv), TORCH_VERSION, TORCH_INDEX_URL (where
# the CPU build comes from), PIP_ARGS (extra pip arguments: a local index, find-links).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG PIP_ARGS=""
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
RUN python3 -m venv /opt/venv \
 && pip install --no-cache-dir $PIP_ARGS --extra-index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION" \
 && pip install --no-cache-dir $PIP_ARGS "uvicorn>=0.29" "uvloop>=0.19" "httptools>=0.6" "starlette>=0.37" "prometheus-client>=0.20" "orjson>=3.9" "numpy>=1.26" "safetensors>=0.4" \
 && find /opt/venv -name '__pycache__' -prune -exec rm -rf {} + \
 && (useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin dilu 2>/dev/null || true)
WORKDIR /opt/dilu/runtime
# Only what runs inside an instance: the instance server and the handler API it imports.
COPY dilu/__init__.py dilu/handler.py dilu/instance_protocol.py dilu/cuda_driver.py dilu/tensor_frames.py ./dilu/
COPY worker/__init__.py ./worker/
COPY worker/instance ./worker/instance
ENV PYTHONPATH=/opt/dilu/runtime
USER 10001:10001
CMD ["python", "-m", "worker.instance"]
