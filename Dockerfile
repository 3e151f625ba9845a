# One image for every BigFleet process (shard, provider, migrations, demo operator).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY bigfleet bigfleet
COPY shard_engine shard_engine
COPY workflows workflows
COPY activities activities
COPY providers providers
COPY migrations migrations
COPY clusters clusters
COPY bench bench
RUN pip install --no-cache-dir .
ENTRYPOINT ["bigfleet"]
