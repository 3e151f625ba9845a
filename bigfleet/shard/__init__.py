"""The shard process: operator sessions, the decision cycle, and the workflows it starts."""
