"""Generated bindings for the compute_scaling.client.v1 scaling service (``make proto``)."""
