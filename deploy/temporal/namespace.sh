#!/bin/sh
# Temporal's readiness gate, run by the `temporal-namespace` service of
# docker-compose.yml in the temporalio/admin-tools image: wait until the
# frontend reports itself healthy (`temporal operator cluster health`), then
# make sure the namespace BigFleet uses exists. BigFleet's processes start
# only after this has exited 0, and register their search attributes
# themselves.
set -eu

ADDRESS="${TEMPORAL_ADDRESS:-temporal:7233}"
NAMESPACE="${BIGFLEET_TEMPORAL_NAMESPACE:-default}"
RETENTION="${NAMESPACE_RETENTION:-72h}"

delay=1
tries=0
until temporal operator cluster health --address "$ADDRESS"; do
    tries=$((tries + 1))
    if [ "$tries" -ge 30 ]; then
        echo "Temporal at $ADDRESS is not healthy after $tries attempts" >&2
        exit 1
    fi
    echo "waiting for Temporal at $ADDRESS (attempt $tries); retrying in ${delay}s"
    sleep "$delay"
    delay=$((delay < 8 ? delay * 2 : 10))
done

if temporal operator namespace describe --address "$ADDRESS" -n "$NAMESPACE" >/dev/null 2>&1; then
    echo "namespace $NAMESPACE exists"
else
    temporal operator namespace create --address "$ADDRESS" -n "$NAMESPACE" --retention "$RETENTION"
    echo "namespace $NAMESPACE created"
fi
