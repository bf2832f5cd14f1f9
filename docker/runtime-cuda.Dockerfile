# The function runtime for GPU instances: a PyTorch CUDA image with Dilu's instance server.
# The worker bind-mounts the kernel-token shim and sets LD_PRELOAD; the GPU is requested by UUID.
#   docker build -f docker/runtime-cuda.Dockerfile -t dilu/runtime-cuda .
# Build arguments: BASE_IMAGE (a PyTorch CUDA runtime image), PIP_ARGS.
ARG BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${BASE_IMAGE}
ARG PIP_ARGS=""
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
RUN pip install --no-cache-dir $PIP_ARGS "uvicorn>=0.29" "uvloop>=0.19" "httptools>=0.6" "starlette>=0.37" "prometheus-client>=0.20" "orjson>=3.9" "safetensors>=0.4" \
 && (useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin dilu 2>/dev/null || true)
WORKDIR /opt/dilu/runtime
COPY dilu/__init__.py dilu/handler.py dilu/instance_protocol.py dilu/cuda_driver.py dilu/tensor_frames.py ./dilu/
COPY worker/__init__.py ./worker/
COPY worker/instance ./worker/instance
ENV PYTHONPATH=/opt/dilu/runtime
USER 10001:10001
CMD ["python", "-m", "worker.instance"]
