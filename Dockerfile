# hubspoke: one image for the hub, the spoke, the sample-dataset generator and
# the Toxiproxy init step (see docker-compose.yml). Runtime dependencies only.

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY service ./service
COPY hub ./hub
COPY spoke ./spoke
COPY loadtest ./loadtest
# No [test] extras: the image only serves.
RUN /opt/venv/bin/pip install '.[s3]'

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# /data and /cache belong to the service user, so named volumes mounted there
# start out writable by it (Docker copies the mount point's owner into a new volume).
RUN groupadd --system --gid 10001 hubspoke \
 && useradd --system --uid 10001 --gid hubspoke --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin hubspoke \
 && mkdir -p /data /cache \
 && chown hubspoke:hubspoke /data /cache
COPY --from=build /opt/venv /opt/venv
COPY deploy/toxiproxy_init.py deploy/toxiproxy.json /opt/hubspoke/deploy/
USER hubspoke:hubspoke
WORKDIR /opt/hubspoke
EXPOSE 8700 8701
CMD ["python", "-m", "hub", "serve", "--root", "/data", "--host", "0.0.0.0", "--port", "8700"]
