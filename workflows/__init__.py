"""Temporal workflow definitions: the durable, deterministic side of machine transitions.

Workflow modules import only ``temporalio.workflow`` and plain dataclasses;
activities are called by name (see ``workflows.contracts``) so nothing that
touches the network is pulled into the sandbox.
"""
