# gpuscope: one image for the exporter, the worker and the demo load.
#   docker build -t gpuscope .                                # every command, NumPy worker
#   docker build --build-arg EXTRAS=all,torch -t gpuscope:torch .   # worker on CUDA via PyTorch
# NVML comes from the host driver: run GPU containers with the NVIDIA Container Toolkit.
FROM python:3.11.11-slim-bookworm

ARG EXTRAS=all
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/gpuscope/src
COPY pyproject.toml README.md ./
COPY core/ core/
COPY middleware/ middleware/
COPY exporter/ exporter/
COPY worker/ worker/
COPY loadgen/ loadgen/
RUN pip install ".[${EXTRAS}]" \
    && useradd --system --uid 10001 --no-create-home gpuscope

USER gpuscope
WORKDIR /opt/gpuscope
EXPOSE 8000 9420
ENTRYPOINT ["gpuscope"]
CMD ["exporter"]
