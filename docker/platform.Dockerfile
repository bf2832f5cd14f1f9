# The Dilu platform: every role (gateway, controller, worker, migrate) behind the `dilu` entrypoint.
#   docker build -f docker/platform.Dockerfile -t dilu/platform .
# The GPU worker of the Kubernetes recipe (instances are its child processes, so it carries
# PyTorch and CUDA's libraries; deploy/kubernetes/overlays/gpu):
#   docker build -f docker/platform.Dockerfile -t dilu/platform-cuda \
#     --build-arg PYTHON_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime \
#     --build-arg VENV_ARGS=--system-site-packages .
# Build arguments (defaults serve real users; CI overrides them to build offline):
#   PYTHON_IMAGE         the Python 3.11+ base (needs python3 with venv)
#   SHIM_BUILDER_IMAGE   any image with a C compiler, make and CUDA's cuda.h (the shim is built there)
#   PIP_ARGS             extra pip arguments (a local index, find-links)
#   VENV_ARGS            arguments of the venv (--system-site-packages: the base image's torch)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG SHIM_BUILDER_IMAGE=nvidia/cuda:12.6.3-devel-ubuntu22.04

FROM ${SHIM_BUILDER_IMAGE} AS shim
COPY shim /src/shim
RUN make -s -C /src/shim BUILD=/out CUDA_HOME=/usr/local/cuda

FROM ${PYTHON_IMAGE}
ARG PIP_ARGS=""
ARG VENV_ARGS=""
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DILU_HOME=/var/lib/dilu
WORKDIR /app
COPY pyproject.toml README.md ./
# The platform's dependencies without torch: the roles never import it (instances do, in the
# function runtime images), and it is most of a gigabyte.
RUN python3 -m venv $VENV_ARGS /opt/venv \
 && python3 -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
open('/tmp/requirements.txt', 'w').write('\n'.join(d for d in deps if not d.startswith('torch')))" \
 && pip install --no-cache-dir $PIP_ARGS -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY dilu ./dilu
COPY gateway ./gateway
COPY worker ./worker
COPY cli ./cli
COPY examples ./examples
COPY shim ./shim
COPY --from=shim /out/libdilu_shim.so ./shim/build/libdilu_shim.so
COPY --from=shim /out/fake/libcuda.so.1 ./shim/build/fake/libcuda.so.1
RUN pip install --no-cache-dir --no-deps $PIP_ARGS -e . && python3 -m compileall -q dilu gateway worker cli
ENTRYPOINT ["dilu"]
CMD ["--help"]
