"""Temporal activities: thin adapters between the workflows and the outside world.

They run inside the shard process that owns the task queue, so they reach
that process's provider clients, operator sessions, store and live engine
through one injected :class:`activities.context.ShardContext`.
"""
