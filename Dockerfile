# One image for the API, the workers and migrations (the command differs per service).
# CPU by default. For a GPU worker image, build with
#   --build-arg TORCH_INDEX_URL=<your PyTorch CUDA wheel index>
# so that torch==2.13.0 comes as the CUDA build; nothing else changes.
FROM python:3.11-slim

ARG TORCH_INDEX_URL=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    PRUNECAST_HOME=/var/lib/prunecast \
    PRUNECAST_DATA_DIR=/data

RUN useradd --create-home --uid 10001 prunecast \
    && mkdir -p /var/lib/prunecast /data /models \
    && chown prunecast /var/lib/prunecast

WORKDIR /srv/prunecast
# Dependencies first (cached layer): torch pinned, from the given index when there is one.
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --index-url "$TORCH_INDEX_URL" torch==2.13.0; \
    else \
        pip install torch==2.13.0; \
    fi
COPY pyproject.toml requirements-assets.txt README.md ./
COPY core/__init__.py core/__init__.py
COPY app/__init__.py app/__init__.py
COPY workers/__init__.py workers/__init__.py
RUN pip install -e . && pip install --no-deps -r requirements-assets.txt
# Then the code (editable install: migrations/ is read from the source tree).
COPY alembic.ini ./
COPY migrations migrations
COPY core core
COPY app app
COPY workers workers

USER prunecast
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)" || exit 1
CMD ["prunecast", "serve", "--host", "0.0.0.0", "--port", "8000"]
