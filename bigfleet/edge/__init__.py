"""A shard's Session port in processes of its own, relaying to the engine process (ADR 0147)."""
