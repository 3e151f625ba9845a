"""The Polars Nanook scaling service adapter: a cluster operator for one Nanook worker pool."""
