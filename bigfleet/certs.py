"""A development certificate authority: ``bigfleet certs`` and the test suites.

It issues what :mod:`bigfleet.identity` reads: leaf certificates with one
``bigfleet://`` URI SAN each, plus DNS/IP SANs so clients can verify the
servers they dial. ECDSA P-256 keys, SHA-256 signatures, usable both as a
server and as a client certificate (a shard serves Sessions and calls
providers with one certificate). ``trustme`` cannot write URI SANs, hence
this module (on the ``cryptography`` package).

Not for production: a real deployment issues certificates from its own CA
(cert-manager, Vault, ...) with the same SAN convention.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bigfleet.identity import Identity

__all__ = ["DEFAULT_HOSTS", "Authority", "Leaf", "write_bundle"]

#: Names every development leaf answers to, so loopback clients can verify it.
DEFAULT_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")

_KEY_FILE_MODE = 0o600


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _general_names(uris: Iterable[str], hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


@dataclass(frozen=True)
class Leaf:
    """An issued certificate and its private key, PEM-encoded."""

    cert: bytes
    key: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        """Write both files (the key readable by its owner only), replacing atomically."""
        _write(cert_path, self.cert, 0o644)
        _write(key_path, self.key, _KEY_FILE_MODE)


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class Authority:
    """A self-signed CA that issues BigFleet leaf certificates."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.key, self.cert = key, cert

    @classmethod
    def create(cls, common_name: str = "BigFleet development CA", *, days: int = 365) -> Authority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> Authority:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: expected an EC private key")
        return cls(key, cert)

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _pem_key(self.key)

    def issue(
        self,
        identity: Identity | None,
        *,
        hosts: Sequence[str] = DEFAULT_HOSTS,
        extra_uris: Sequence[str] = (),
        days: float = 365,
        not_before: dt.datetime | None = None,
        not_after: dt.datetime | None = None,
        common_name: str | None = None,
    ) -> Leaf:
        """A leaf for ``identity`` (None: no ``bigfleet://`` SAN, for tests of refusal).

        ``extra_uris`` adds more URI SANs (a second identity makes the
        certificate unusable, which tests exercise); ``not_before`` and
        ``not_after`` override the validity window (an expired certificate).
        """
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start = not_before or now - dt.timedelta(minutes=5)
        end = not_after or now + dt.timedelta(days=days)
        uris = ([identity.uri] if identity is not None else []) + list(extra_uris)
        cn = common_name or (identity.uri if identity is not None else "bigfleet-anonymous")
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        names = _general_names(uris, hosts)
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Leaf(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def leaf_stem(identity: Identity) -> str:
    """File name stem of a leaf: ``admin``, ``readonly``, ``cluster-web-1``, ``shard-s0``."""
    return identity.role.value + (f"-{identity.name}" if identity.name else "")


def write_bundle(
    out: Path,
    identities: Iterable[Identity],
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    days: int = 365,
) -> list[Path]:
    """Write ``ca.pem`` (+ ``ca.key``) and ``<stem>.pem``/``<stem>.key`` per identity.

    An existing ``ca.pem``/``ca.key`` in ``out`` is reused, so leaves can be
    added later without invalidating the ones already handed out. Returns the
    certificate files written.
    """
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = out / "ca.pem", out / "ca.key"
    if ca_cert.exists() and ca_key.exists():
        ca = Authority.load(ca_cert, ca_key)
    else:
        ca = Authority.create(days=max(days, 1))
        _write(ca_key, ca.key_pem, _KEY_FILE_MODE)
        _write(ca_cert, ca.cert_pem, 0o644)
    written = []
    for identity in identities:
        stem = leaf_stem(identity)
        leaf = ca.issue(identity, hosts=hosts, days=days)
        leaf.write(out / f"{stem}.pem", out / f"{stem}.key")
        written.append(out / f"{stem}.pem")
    return written
