"""The cluster side, simulated: operators that dial a shard and speak ``Shard/Session``.

Used by the dev stack's demo fleet and by end-to-end tests. A real
Kubernetes operator (such as the public Go reference's) speaks the same wire.
"""
