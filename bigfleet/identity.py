"""Who is calling: mutual TLS, certificate identities and the checks every server makes.

Identity is taken from exactly one ``bigfleet://`` URI SAN on the peer's
certificate (the Go reference's scheme, so certificates issued for it work
here):

    bigfleet://cluster/<id>    a cluster operator; may Hello and send roll-ups only as <id>
    bigfleet://shard/<id>      a shard, as it presents itself to providers
    bigfleet://provider/<name> a provider server
    bigfleet://admin           may do everything
    bigfleet://readonly        may only read (InspectNeeds, listings)

mTLS is opt-in (``BIGFLEET_TLS_CERT``/``_KEY``/``_CA``, see
:class:`bigfleet.config.TLSFiles`). On a plaintext server every check here
passes: identity is only as strong as the transport, and a plaintext
deployment trusts its network.

    TLSFiles ──▶ KeyPairSource (re-reads changed files, keeps the last coherent pair)
                    ├─▶ server_credentials()   dynamic: each new handshake sees fresh files
                    └─▶ ChannelSecurity        (generation, channel credentials) for clients
    servicer ──▶ Guard.authorize(context, allowed roles[, name])
                    └─▶ PERMISSION_DENIED, bigfleet_identity_refusals_total, one log per peer

Handshake-level refusals (a certificate from another CA, an expired one, no
certificate at all) happen inside gRPC's TLS stack before any Python code
runs; the client sees UNAVAILABLE and the server's gRPC log records the
handshake failure. Everything a valid certificate may still be refused for
(no or several identities, the wrong role, another cluster's id) is refused
here, counted and logged.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import os
import ssl
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from temporalio.service import TLSConfig

from bigfleet.aio import within
from bigfleet.config import TLSFiles
from bigfleet.metrics import IDENTITY_REFUSALS
from providers.errors import ProviderUnavailable
from providers.server import ServerSecurity

log = logging.getLogger(__name__)

__all__ = [
    "ADMINS",
    "ANYONE",
    "READERS",
    "REFUSALS",
    "SCHEME",
    "ChannelSecurity",
    "Guard",
    "Identity",
    "IdentityError",
    "KeyPairSource",
    "ProviderPolicy",
    "Role",
    "certificate_uris",
    "channel",
    "client_security",
    "identity_from_uris",
    "own_identity",
    "peer_identity",
    "presented_identity",
    "provider_security",
    "requires",
    "server_credentials",
    "temporal_tls",
]

SCHEME = "bigfleet://"

#: Refusals of peers whose certificate the TLS stack accepted but whose identity
#: may not do what they asked. ``service`` is the gRPC service (or surface),
#: ``reason`` one of :class:`IdentityError`'s reasons (defined in ``bigfleet.metrics``).
REFUSALS = IDENTITY_REFUSALS


class Role(enum.StrEnum):
    """What a certificate's identity is allowed to be."""

    CLUSTER = "cluster"
    SHARD = "shard"
    PROVIDER = "provider"
    ADMIN = "admin"
    READONLY = "readonly"


#: Roles that carry a name (``cluster/<id>``); the others stand alone.
_NAMED = frozenset({Role.CLUSTER, Role.SHARD, Role.PROVIDER})

#: The usual policies. ``admin`` passes every check (it is a superset).
ADMINS: frozenset[Role] = frozenset({Role.ADMIN})
READERS: frozenset[Role] = frozenset({Role.ADMIN, Role.READONLY})
ANYONE: frozenset[Role] = frozenset(Role)


class IdentityError(PermissionError):
    """A caller that may not do what it asked; ``reason`` is a short, stable label."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason, self.detail = reason, detail
        super().__init__(detail)


@dataclass(frozen=True)
class Identity:
    """One certificate's identity: a role and, for named roles, the name."""

    role: Role
    name: str = ""

    def __post_init__(self) -> None:
        if (self.role in _NAMED) != bool(self.name):
            need = "needs a name" if self.role in _NAMED else "takes no name"
            raise ValueError(f"role {self.role.value} {need}")

    @property
    def uri(self) -> str:
        """The SAN this identity is written as (``bigfleet://cluster/web-1``)."""
        return f"{SCHEME}{self.role.value}" + (f"/{self.name}" if self.name else "")

    def __str__(self) -> str:
        return self.uri

    @classmethod
    def parse(cls, uri: str) -> Identity:
        """``bigfleet://<role>[/<name>]`` -> identity; :class:`IdentityError` if malformed."""
        if not uri.startswith(SCHEME):
            raise IdentityError("malformed-identity", f"{uri!r} is not a {SCHEME} URI")
        role_text, sep, name = uri[len(SCHEME) :].partition("/")
        try:
            role = Role(role_text)
        except ValueError:
            raise IdentityError(
                "malformed-identity",
                f"{uri!r}: unknown role {role_text!r} "
                f"(expected one of {', '.join(r.value for r in Role)})",
            ) from None
        if role in _NAMED and not name:
            raise IdentityError("malformed-identity", f"{uri!r}: role {role.value} needs a name")
        if role not in _NAMED and sep:
            raise IdentityError("malformed-identity", f"{uri!r}: role {role.value} takes no name")
        if any(ch.isspace() or ch == "\x00" for ch in name):
            raise IdentityError("malformed-identity", f"{uri!r}: the name has blanks or NULs")
        return cls(role, name)


def identity_from_uris(uris: Iterable[str]) -> Identity:
    """The identity among a certificate's URI SANs: exactly one must be ``bigfleet://``."""
    ours = [u for u in uris if u.startswith(SCHEME)]
    if not ours:
        raise IdentityError("no-identity", f"the certificate has no {SCHEME} URI SAN")
    if len(ours) > 1:
        raise IdentityError(
            "several-identities",
            f"the certificate has {len(ours)} {SCHEME} URI SANs ({', '.join(sorted(ours))}); "
            "exactly one is allowed",
        )
    return Identity.parse(ours[0])


def certificate_uris(pem: bytes) -> list[str]:
    """Every URI SAN of a PEM certificate."""
    return _uris(x509.load_pem_x509_certificate(pem))


def _uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [str(u) for u in san.value.get_values_for_type(x509.UniformResourceIdentifier)]


# ----------------------------------------------------------------- files


@dataclass(frozen=True)
class KeyPair:
    """One coherent set of PEM bytes: a certificate, its key, and the CA bundle."""

    cert: bytes
    key: bytes
    ca: bytes
    generation: int


class KeyPairSource:
    """The TLS files of a process, re-read when they change.

    ``current()`` stats the three files (at most once per ``check_every_s``)
    and re-reads them when a modification time or size changed. A rotation
    caught half-way (a new certificate beside the old key) is not used: the
    previous coherent pair stays in force and a warning is logged until the
    files agree. ``generation`` grows by one on every accepted change.
    """

    def __init__(self, files: TLSFiles, *, check_every_s: float = 1.0) -> None:
        self.files = files
        self.check_every_s = check_every_s
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._pair = self._load(0)
        self._checked = time.monotonic()

    def _stat(self) -> tuple[tuple[int, int], ...]:
        out = []
        for path in (self.files.cert, self.files.key, self.files.ca):
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _load(self, generation: int) -> KeyPair:
        cert = self.files.cert.read_bytes()
        key = self.files.key.read_bytes()
        ca = self.files.ca.read_bytes()
        _check_pair(cert, key, self.files)
        if not ca.strip():
            raise ValueError(f"{self.files.ca}: the CA bundle is empty")
        return KeyPair(cert, key, ca, generation)

    def current(self) -> KeyPair:
        """The newest coherent files (thread-safe: gRPC's handshake thread calls it)."""
        now = time.monotonic()
        if now - self._checked < self.check_every_s:
            return self._pair
        with self._lock:
            self._checked = now
            try:
                stamp = self._stat()
            except OSError as err:
                log.warning("TLS files unreadable (%s); keeping the loaded certificate", err)
                return self._pair
            if stamp == self._stamp:
                return self._pair
            try:
                pair = self._load(self._pair.generation + 1)
            except (OSError, ValueError) as err:
                log.warning("TLS files changed but are not usable yet (%s); keeping the old", err)
                return self._pair
            self._stamp, self._pair = stamp, pair
            log.info(
                "reloaded TLS certificate %s (generation %d)", self.files.cert, pair.generation
            )
            return pair

    def identity(self) -> Identity:
        """This process's own identity (from its certificate)."""
        return identity_from_uris(certificate_uris(self.current().cert))


def _check_pair(cert_pem: bytes, key_pem: bytes, files: TLSFiles) -> None:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as err:
        raise ValueError(f"{files.cert}: not a PEM certificate ({err})") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{files.key}: not an unencrypted PEM private key ({err})") from None
    fmt = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    if cert.public_key().public_bytes(enc, fmt) != key.public_key().public_bytes(enc, fmt):
        raise ValueError(f"{files.key} is not the key of {files.cert}")


def server_credentials(source: KeyPairSource) -> grpc.ServerCredentials:
    """Server credentials that require a client certificate from the CA bundle.

    gRPC asks the fetcher on every new handshake; it hands over fresh
    certificates only when the files changed. Connections already open keep
    the certificate they were made with, so healthy sessions are not dropped
    by a rotation.
    """
    first = source.current()
    served = [first.generation]

    def config(pair: KeyPair) -> Any:
        return grpc.ssl_server_certificate_configuration(
            [(pair.key, pair.cert)], root_certificates=pair.ca
        )

    def fetch() -> Any:
        pair = source.current()
        if pair.generation == served[0]:
            return None
        served[0] = pair.generation
        return config(pair)

    return grpc.dynamic_ssl_server_credentials(
        config(first), fetch, require_client_authentication=True
    )


class ChannelSecurity:
    """Client credentials from a :class:`KeyPairSource`, rebuilt when the files change.

    A channel's credentials are fixed when it is made; a long-lived client
    compares ``generation()`` with the one its channel was made with and
    makes a new channel when it moved (see ``providers.client``).
    """

    def __init__(self, source: KeyPairSource) -> None:
        self.source = source
        self._built: tuple[int, grpc.ChannelCredentials] | None = None
        self._verified: set[tuple[str, str, int]] = set()
        self._checking: dict[tuple[str, str, int], asyncio.Future[None]] = {}
        self._logged: set[tuple[str, str, int]] = set()

    def generation(self) -> int:
        return self.source.current().generation

    async def verify_peer(self, address: str, provider_name: str) -> None:
        """Check that the server at ``address`` presents ``bigfleet://provider/<name>``.

        grpcio's asyncio client verifies the chain and the host name but
        exposes no peer certificate, so the identity is read by a separate TLS
        handshake with the same files, once per (address, certificate
        generation): a shard never sends a fencing token or a mutation to a
        server that is not the provider it was configured with. A wrong
        identity, or no answer, raises :class:`ProviderUnavailable` (the
        callers' retries then wait for a fix) and is logged once.
        """
        pair = self.source.current()
        key = (address, provider_name, pair.generation)
        if key in self._verified:
            return
        # Calls that arrive together (a shard's first List and its activities) share
        # one handshake; a failed one is tried again by the next call.
        check = self._checking.get(key)
        if check is None:
            check = asyncio.ensure_future(self._check(address, provider_name, pair, key))
            self._checking[key] = check
            check.add_done_callback(lambda _: self._checking.pop(key, None))
        await asyncio.shield(check)

    async def _check(
        self, address: str, provider_name: str, pair: KeyPair, key: tuple[str, str, int]
    ) -> None:
        expected = Identity(Role.PROVIDER, provider_name)
        try:
            presented = await presented_identity(address, pair)
        except IdentityError as err:
            self._refuse(key, f"the provider at {address} {err.detail}")
        except (OSError, ssl.SSLError, TimeoutError) as err:
            raise ProviderUnavailable(
                f"provider {provider_name!r} at {address}: TLS handshake failed ({err})"
            ) from err
        if presented != expected:
            self._refuse(
                key,
                f"the server at {address} presents {presented.uri}, not {expected.uri}: "
                "check the provider's address and certificate",
            )
        self._verified.add(key)
        self._logged.discard(key)

    def _refuse(self, key: tuple[str, str, int], message: str) -> NoReturn:
        if key not in self._logged:
            self._logged.add(key)
            log.error("refusing to call a provider: %s", message)
        raise ProviderUnavailable(message)

    def current(self) -> grpc.ChannelCredentials:
        """Credentials from the newest files (for a client that reconnects by itself)."""
        return self.credentials()[1]

    def credentials(self) -> tuple[int, grpc.ChannelCredentials]:
        pair = self.source.current()
        if self._built is None or self._built[0] != pair.generation:
            creds = grpc.ssl_channel_credentials(
                root_certificates=pair.ca, private_key=pair.key, certificate_chain=pair.cert
            )
            self._built = (pair.generation, creds)
        return self._built


async def presented_identity(address: str, pair: KeyPair, *, within_s: float = 5.0) -> Identity:
    """The identity the TLS server at ``address`` (``host:port``) presents.

    A handshake as a gRPC client makes it (HTTP/2 by ALPN, this process's
    certificate, the chain and the host name checked against ``pair.ca``),
    given ``within_s`` seconds; no request is sent.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"provider address {address!r}: expected host:port")
    host = host.strip("[]")
    context = ssl.create_default_context(cadata=pair.ca.decode())
    context.set_alpn_protocols(["h2"])
    with tempfile.TemporaryDirectory(prefix="bigfleet-tls-") as tmp:
        cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert.write_bytes(pair.cert)
        key.touch(mode=0o600)
        key.write_bytes(pair.key)
        context.load_cert_chain(cert, key)
    _, writer = await within(
        asyncio.open_connection(host, int(port), ssl=context, server_hostname=host), within_s
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        # Nothing was sent, so nothing is lost by not closing gracefully: a
        # graceful close waits for the server's TLS close_notify, which a gRPC
        # server does not send to a connection that never spoke HTTP/2, until
        # asyncio's 30 s SSL shutdown timeout.
        writer.transport.abort()
    if not der:
        raise IdentityError("no-identity", "presented no certificate")
    return identity_from_uris(_uris(x509.load_der_x509_certificate(der)))


def channel(
    address: str,
    security: ChannelSecurity | None,
    *,
    options: Iterable[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A channel to ``address``: mutual TLS with ``security``, plaintext without."""
    opts = list(options)
    if security is None:
        return grpc.aio.insecure_channel(address, options=opts)
    _, creds = security.credentials()
    return grpc.aio.secure_channel(address, creds, options=opts)


def client_security(files: TLSFiles | None) -> ChannelSecurity | None:
    """Client credentials for a process's calls (None: plaintext)."""
    return ChannelSecurity(KeyPairSource(files)) if files is not None else None


def temporal_tls(source: KeyPairSource, *, domain: str | None = None) -> TLSConfig:
    """temporalio's ``TLSConfig`` presenting this process's certificate to Temporal.

    Read when the client connects; a rotated certificate takes effect at the
    process's next start (temporalio's client holds its own connection).
    """
    pair = source.current()
    return TLSConfig(
        server_root_ca_cert=pair.ca,
        client_cert=pair.cert,
        client_private_key=pair.key,
        domain=domain,
    )


# ----------------------------------------------------------- authorization


def _auth_values(auth: Mapping[str, Iterable[bytes]], key: str) -> list[str]:
    return [v.decode("utf-8", "replace") for v in auth.get(key, ())]


def peer_identity(context: Any) -> Identity | None:
    """The caller's identity, or None on a plaintext connection (nothing to check).

    Raises :class:`IdentityError` when the connection is TLS but the
    certificate carries no, several or a malformed ``bigfleet://`` identity.
    """
    auth: Mapping[str, Iterable[bytes]] = context.auth_context()
    if _auth_values(auth, "transport_security_type") != ["ssl"]:
        return None
    if "peer_uri" in auth:
        uris = _auth_values(auth, "peer_uri")
    else:  # older gRPC cores: every SAN, of which only URIs can carry our scheme
        uris = _auth_values(auth, "x509_subject_alternative_name")
    return identity_from_uris(uris)


def _peer_label(context: Any) -> str:
    auth: Mapping[str, Iterable[bytes]] = context.auth_context()
    subject = _auth_values(auth, "x509_subject")
    uris = [u for u in _auth_values(auth, "peer_uri") if u.startswith(SCHEME)]
    return ",".join(uris) or (subject[0] if subject else "") or str(context.peer())


class Guard:
    """The authorization check of one gRPC service.

    ``await guard.authorize(context, READERS)`` returns the caller's identity
    (None on plaintext) or aborts the call with PERMISSION_DENIED. Refusals are
    counted in ``bigfleet_identity_refusals_total{service, reason}`` and logged
    once per (peer, reason) so a misconfigured client cannot flood the log.
    """

    _LOGGED_MAX = 4096

    def __init__(self, service: str) -> None:
        self.service = service
        self._logged: OrderedDict[tuple[str, str], None] = OrderedDict()

    def check(
        self, context: Any, allowed: Collection[Role], *, name: str | None = None
    ) -> Identity | None:
        """Raise :class:`IdentityError` unless the caller may act (as ``name``, if given).

        ``name`` binds named roles: a ``cluster/<id>`` certificate passes only
        when ``<id> == name``. ``admin`` passes every check.
        """
        ident = peer_identity(context)
        if ident is None or ident.role == Role.ADMIN:
            return ident
        if ident.role not in allowed:
            raise IdentityError(
                "wrong-role",
                f"{ident} may not call {self.service} "
                f"(allowed: {', '.join(sorted({r.value for r in allowed} | {Role.ADMIN.value}))})",
            )
        if name is not None and ident.role in _NAMED and ident.name != name:
            raise IdentityError(
                "name-mismatch", f"{ident} may act only as {ident.name!r}, not as {name!r}"
            )
        return ident

    async def authorize(
        self, context: Any, allowed: Collection[Role], *, name: str | None = None
    ) -> Identity | None:
        """:meth:`check`, turning a refusal into PERMISSION_DENIED (counted, logged once)."""
        try:
            return self.check(context, allowed, name=name)
        except IdentityError as err:
            self.refused(context, err)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(err))
            raise  # abort raises; this keeps type checkers and readers sure

    def refused(self, context: Any, err: IdentityError) -> None:
        """Count a refusal and log it the first time this peer is refused for this reason."""
        REFUSALS.labels(self.service, err.reason).inc()
        key = (_peer_label(context), err.reason)
        if key in self._logged:
            self._logged.move_to_end(key)
            return
        self._logged[key] = None
        if len(self._logged) > self._LOGGED_MAX:
            self._logged.popitem(last=False)
        log.warning(
            "%s refused %s from %s: %s (further refusals of this peer are only counted)",
            self.service,
            err.reason,
            context.peer(),
            err,
        )


_Servicer = TypeVar("_Servicer")
_Request = TypeVar("_Request")
_Reply = TypeVar("_Reply")


def requires(
    service: str, allowed: Collection[Role]
) -> Callable[
    [Callable[[_Servicer, _Request, Any], Awaitable[_Reply]]],
    Callable[[_Servicer, _Request, Any], Awaitable[_Reply]],
]:
    """Decorate a unary servicer method so only ``allowed`` roles (and admin) may call it.

    For example, a read-only service::

        class ShardReadServicer(shardread_pb2_grpc.ShardReadServicer):
            @requires("bigfleet.v1alpha1.ShardRead", READERS)
            async def InspectNeeds(self, request, context): ...

    On a plaintext server the check passes (there is no identity to check).
    """
    guard = Guard(service)

    def wrap(
        method: Callable[[_Servicer, _Request, Any], Awaitable[_Reply]],
    ) -> Callable[[_Servicer, _Request, Any], Awaitable[_Reply]]:
        @functools.wraps(method)
        async def checked(self: _Servicer, request: _Request, context: Any) -> _Reply:
            await guard.authorize(context, allowed)
            return await method(self, request, context)

        return checked

    return wrap


def own_identity(files: TLSFiles) -> Identity:
    """The identity in a process's own certificate (a clear error if it has none)."""
    return identity_from_uris(certificate_uris(Path(files.cert).read_bytes()))


# ---------------------------------------------------------------- providers

PROVIDER_SERVICE = "bigfleet.v1alpha1.CapacityProvider"


class ProviderPolicy:
    """Who may call a provider server (``providers.server.CallerPolicy``).

    Mutations need ``shard/<id>`` whose id is the fencing token's shard id
    (a shard cannot fence, or be fenced for, another shard's machines); reads
    are open to shards and ``readonly``; ``admin`` may do both.
    """

    def __init__(self) -> None:
        self.guard = Guard(PROVIDER_SERVICE)

    async def may_mutate(self, context: Any, shard_id: str) -> None:
        await self.guard.authorize(context, {Role.SHARD}, name=shard_id)

    async def may_read(self, context: Any) -> None:
        await self.guard.authorize(context, {Role.SHARD, Role.READONLY})


def provider_security(source: KeyPairSource) -> ServerSecurity:
    """Mutual TLS and :class:`ProviderPolicy` for a provider server with these files."""
    return ServerSecurity(server_credentials(source), ProviderPolicy())
