"""Certificate identities: the bigfleet:// SAN scheme, the TLS settings, the dev CA."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bigfleet.certs import Authority
from bigfleet.cli import app
from bigfleet.config import ConfigError, Settings, parse_tls
from bigfleet.identity import (
    Identity,
    IdentityError,
    KeyPairSource,
    Role,
    certificate_uris,
    identity_from_uris,
    own_identity,
)


@pytest.mark.parametrize(
    ("uri", "identity"),
    [
        ("bigfleet://cluster/web-1", Identity(Role.CLUSTER, "web-1")),
        ("bigfleet://shard/shard-0", Identity(Role.SHARD, "shard-0")),
        ("bigfleet://provider/simcloud", Identity(Role.PROVIDER, "simcloud")),
        ("bigfleet://admin", Identity(Role.ADMIN)),
        ("bigfleet://readonly", Identity(Role.READONLY)),
    ],
)
def test_each_role_parses_from_its_uri_and_writes_back_the_same(
    uri: str, identity: Identity
) -> None:
    assert Identity.parse(uri) == identity
    assert identity.uri == uri


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("bigfleet://cluster", "needs a name"),
        ("bigfleet://cluster/", "needs a name"),
        ("bigfleet://admin/root", "takes no name"),
        ("bigfleet://operator/x", "unknown role"),
        ("spiffe://cluster/x", "not a bigfleet:// URI"),
        ("bigfleet://cluster/a b", "blanks"),
    ],
)
def test_a_malformed_identity_is_refused_with_its_reason(uri: str, why: str) -> None:
    with pytest.raises(IdentityError, match=why) as caught:
        Identity.parse(uri)
    assert caught.value.reason == "malformed-identity"


def test_exactly_one_bigfleet_uri_is_the_identity_and_other_uris_are_ignored() -> None:
    got = identity_from_uris(["spiffe://example.org/x", "bigfleet://cluster/c1"])
    assert got == Identity(Role.CLUSTER, "c1")


def test_no_bigfleet_uri_and_two_bigfleet_uris_are_both_refused() -> None:
    with pytest.raises(IdentityError) as none:
        identity_from_uris(["https://example.org"])
    assert none.value.reason == "no-identity"
    with pytest.raises(IdentityError) as two:
        identity_from_uris(["bigfleet://cluster/a", "bigfleet://admin"])
    assert two.value.reason == "several-identities"


def test_tls_is_off_when_no_variable_is_set() -> None:
    assert parse_tls({}) is None
    assert Settings.from_env({}).tls is None


def test_a_partial_tls_configuration_is_an_error_naming_the_missing_variable(
    tmp_path: Path,
) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="BIGFLEET_TLS_KEY: must be set"):
        parse_tls({"BIGFLEET_TLS_CERT": str(cert)})


def test_a_tls_file_that_does_not_exist_is_an_error_naming_it(tmp_path: Path) -> None:
    present = tmp_path / "x.pem"
    present.write_text("x")
    env = {
        "BIGFLEET_TLS_CERT": str(present),
        "BIGFLEET_TLS_KEY": str(present),
        "BIGFLEET_TLS_CA": str(tmp_path / "missing.pem"),
    }
    with pytest.raises(ConfigError, match="BIGFLEET_TLS_CA"):
        parse_tls(env)


def test_temporal_tls_takes_a_boolean() -> None:
    assert Settings.from_env({"BIGFLEET_TEMPORAL_TLS": "true"}).temporal_tls
    with pytest.raises(ConfigError, match="BIGFLEET_TEMPORAL_TLS"):
        Settings.from_env({"BIGFLEET_TEMPORAL_TLS": "maybe"})


def test_a_leaf_carries_its_identity_as_the_only_bigfleet_uri() -> None:
    leaf = Authority.create().issue(Identity(Role.SHARD, "s0"))
    assert certificate_uris(leaf.cert) == ["bigfleet://shard/s0"]


def test_bigfleet_certs_writes_a_ca_and_one_leaf_per_role(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    result = CliRunner().invoke(
        app, ["certs", str(out), "--cluster", "web-1", "--shard", "shard-0", "--provider", "bm"]
    )
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [
            "ca.pem",
            "ca.key",
            *(
                f"{stem}.{ext}"
                for stem in ("cluster-web-1", "shard-shard-0", "provider-bm", "admin", "readonly")
                for ext in ("pem", "key")
            ),
        ]
    )
    assert (out / "ca.key").stat().st_mode & 0o077 == 0
    env = {
        "BIGFLEET_TLS_CERT": str(out / "cluster-web-1.pem"),
        "BIGFLEET_TLS_KEY": str(out / "cluster-web-1.key"),
        "BIGFLEET_TLS_CA": str(out / "ca.pem"),
    }
    tls = Settings.from_env(env).tls
    assert tls is not None
    assert own_identity(tls) == Identity(Role.CLUSTER, "web-1")
    assert KeyPairSource(tls).identity() == Identity(Role.CLUSTER, "web-1")


def test_bigfleet_certs_reuses_its_ca_so_earlier_leaves_stay_valid(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["certs", str(tmp_path), "--cluster", "a"]).exit_code == 0
    ca = (tmp_path / "ca.pem").read_bytes()
    assert runner.invoke(app, ["certs", str(tmp_path), "--cluster", "b"]).exit_code == 0
    assert (tmp_path / "ca.pem").read_bytes() == ca


def test_bigfleet_certs_refuses_a_malformed_name(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["certs", str(tmp_path), "--cluster", "a b"])
    assert result.exit_code == 2
    assert "blanks" in result.output


def test_a_key_that_does_not_match_its_certificate_is_refused(tmp_path: Path) -> None:
    ca = Authority.create()
    one, two = ca.issue(Identity(Role.ADMIN)), ca.issue(Identity(Role.ADMIN))
    (tmp_path / "c.pem").write_bytes(one.cert)
    (tmp_path / "k.pem").write_bytes(two.key)
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem)
    env = {
        "BIGFLEET_TLS_CERT": str(tmp_path / "c.pem"),
        "BIGFLEET_TLS_KEY": str(tmp_path / "k.pem"),
        "BIGFLEET_TLS_CA": str(tmp_path / "ca.pem"),
    }
    tls = parse_tls(env)
    assert tls is not None
    with pytest.raises(ValueError, match="is not the key of"):
        KeyPairSource(tls)
