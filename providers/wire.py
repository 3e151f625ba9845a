"""Translation between the provider domain types and the bigfleet.v1alpha1
wire: messages both ways, and error classes to and from gRPC status codes.

One table, `ERROR_CODES`, decides the status code of every error class; the
server uses it to answer, the client inverts it to raise.
"""

from __future__ import annotations

import grpc

from bigfleet.v1alpha1 import provider_pb2
from providers.errors import (
    Fenced,
    InvalidArgument,
    InvalidTransition,
    NotFound,
    ProviderError,
    ProviderUnavailable,
    Unimplemented,
)
from providers.model import Ack, FencingToken, Machine, MachineList

#: The status code each error travels as. FAILED_PRECONDITION is fencing only.
ERROR_CODES: dict[type[ProviderError], grpc.StatusCode] = {
    Fenced: grpc.StatusCode.FAILED_PRECONDITION,
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    InvalidTransition: grpc.StatusCode.ABORTED,
    Unimplemented: grpc.StatusCode.UNIMPLEMENTED,
    ProviderUnavailable: grpc.StatusCode.UNAVAILABLE,
}

_FROM_CODE: dict[grpc.StatusCode, type[ProviderError]] = {
    code: cls for cls, code in ERROR_CODES.items()
}
# Not answers a provider chooses: the call was slow, or cut off on the way (a
# proxy, a load balancer or the server shutting down cancels it). Whether the
# request took effect is unknown, so the caller retries with a fresh token.
_FROM_CODE[grpc.StatusCode.DEADLINE_EXCEEDED] = ProviderUnavailable
_FROM_CODE[grpc.StatusCode.CANCELLED] = ProviderUnavailable


def status_code(error: ProviderError) -> grpc.StatusCode:
    """The wire status of a provider error (UNKNOWN for the bare base class)."""
    for cls in type(error).__mro__:
        if cls in ERROR_CODES:
            return ERROR_CODES[cls]
    return grpc.StatusCode.UNKNOWN


def error_from_status(code: grpc.StatusCode, details: str) -> ProviderError:
    """The typed error for a status a provider answered with. Codes outside
    the vocabulary (INTERNAL, UNKNOWN, ...) become a plain `ProviderError`
    whose message names the code."""
    cls = _FROM_CODE.get(code)
    if cls is None:
        return ProviderError(f"{code.name}: {details}")
    return cls(details)


def token_from(shard_id: str, epoch: int, sequence: int) -> FencingToken:
    """The fencing token carried by a request's three fields."""
    return FencingToken(shard_id, epoch, sequence)


def machine_to_pb(machine: Machine) -> provider_pb2.Machine:
    """Domain snapshot -> wire Machine."""
    message = provider_pb2.Machine(
        id=machine.id,
        state=provider_pb2.MachineState.ValueType(int(machine.state)),
        instance_type=machine.instance_type,
        zone=machine.zone,
        capacity_type=provider_pb2.CapacityType.ValueType(int(machine.capacity_type)),
        price_per_hour=machine.price_per_hour,
        interruption_probability=machine.interruption_probability,
        labels=dict(machine.labels),
        last_error=machine.last_error,
        cluster=machine.cluster,
        shard_metadata=dict(machine.shard_metadata),
    )
    if machine.host is not None:
        message.host.provider = machine.host.provider
        message.host.ref = machine.host.ref
    if machine.resources:
        message.resources.resources.update(machine.resources)
    if machine.allocatable:
        message.allocatable.resources.update(machine.allocatable)
    return message


def ack_to_pb(ack: Ack) -> provider_pb2.TransitionAck:
    """Domain Ack -> wire TransitionAck."""
    return provider_pb2.TransitionAck(
        operation_id=ack.operation_id, machine=machine_to_pb(ack.machine)
    )


def list_to_pb(listing: MachineList) -> provider_pb2.MachineList:
    """Domain MachineList -> wire MachineList."""
    return provider_pb2.MachineList(
        machines=[machine_to_pb(m) for m in listing.machines], revision=listing.revision
    )


__all__ = [
    "ERROR_CODES",
    "ack_to_pb",
    "error_from_status",
    "list_to_pb",
    "machine_to_pb",
    "status_code",
    "token_from",
]
