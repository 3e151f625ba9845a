"""BigFleet: a fleet-level infrastructure autoscaler.

The application package: configuration, process wiring (dev stack, shard,
gateway), store access, the CLI, and the generated wire bindings under
``bigfleet.v1alpha1``.
"""

__version__ = "0.1.0"
