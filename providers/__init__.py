"""Capacity providers for BigFleet: a simulated cloud, simulated bare metal,
the shared core that keeps the bigfleet.v1alpha1.CapacityProvider contract,
a gRPC server and client for that wire, and a recording fake.

See providers/README.md. Submodules are imported explicitly; importing this
package starts nothing.
"""
