"""Certificates for a TLS cluster: a private CA, a node certificate and a client certificate.

``disque-py gen-certs DIR`` (:mod:`.cli`) is the command; this module does the work:

* :func:`make_bundle` builds everything in memory (pure: no file, no clock unless
  ``now`` is left out): a CA that signs the two others, a **node** certificate with
  both ``serverAuth`` and ``clientAuth`` extended key usage (a node is a server to
  its clients, and on the cluster bus, where links use mutual TLS, it is the client
  of its peers as well as their server), with the DNS names and IP addresses the
  nodes are reached at as subject alternative names, and a **client** certificate
  (``clientAuth`` only) for applications when nodes require client certificates;
* :func:`write_bundle` writes it as PEM files: ``ca.crt ca.key node.crt node.key
  client.crt client.key``, keys readable by their owner only (0600), refusing to
  replace existing files unless asked to.

One node certificate serves every node: list every node's names and addresses when
making it. Anyone holding ``ca.key`` can mint certificates the nodes trust: keep it
off the nodes once the certificates are made.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CLOCK_SKEW",
    "FILES",
    "KEY_TYPES",
    "Bundle",
    "CertError",
    "Issued",
    "make_bundle",
    "new_key",
    "parse_ips",
    "write_bundle",
]

#: The key types offered: an EC key on NIST P-256 (small, fast, the default) or RSA.
KEY_TYPES = ("ec", "rsa2048", "rsa3072")
#: Every file written, in the order written. The ``.key`` files are private (0600).
FILES = ("ca.crt", "ca.key", "node.crt", "node.key", "client.crt", "client.key")
#: Certificates start this long before "now", so that a peer whose clock is a little
#: behind does not see them as not yet valid.
CLOCK_SKEW = _dt.timedelta(minutes=5)

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class CertError(Exception):
    """A request that cannot be honoured (bad name or address, files in the way)."""


@dataclass(frozen=True)
class Issued:
    """One certificate and its private key."""

    cert: x509.Certificate
    key: PrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclass(frozen=True)
class Bundle:
    """A CA and the node and client certificates it signed."""

    ca: Issued
    node: Issued
    client: Issued
    files: dict[str, bytes] = field(default_factory=dict, repr=False)  # name -> PEM, see FILES


def new_key(key_type: str = "ec") -> PrivateKey:
    """A fresh private key of one of :data:`KEY_TYPES`."""
    if key_type == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type in ("rsa2048", "rsa3072"):
        return rsa.generate_private_key(public_exponent=65537, key_size=int(key_type[3:]))
    raise CertError("unknown key type %r: use one of %s" % (key_type, ", ".join(KEY_TYPES)))


def parse_ips(values: Iterable[str]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_address(value.strip()))
        except ValueError:
            raise CertError("%r is not an IP address (give host names with --dns)" % value) from None
    return out


def _check_dns(names: Iterable[str]) -> list[str]:
    out = []
    for name in names:
        name = name.strip().rstrip(".")
        labels = name.split(".")
        ok = bool(name) and name.isascii() and len(name) <= 253 and all(
            label and len(label) <= 63 and all(c.isalnum() or c in "-_*" for c in label) for label in labels
        )
        if not ok:
            raise CertError("%r is not a DNS name (ASCII labels separated by dots; IP addresses go with --ip)"
                            % name)  # fmt: skip
        try:
            ipaddress.ip_address(name)
        except ValueError:
            out.append(name)
        else:
            raise CertError("%r is an IP address: give it with --ip, clients check addresses apart from names"
                            % name)  # fmt: skip
    return out


def _name(common_name: str) -> x509.Name:
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "disque-py"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])  # fmt: skip


def _leaf_usage(key: PrivateKey) -> x509.KeyUsage:
    rsa_key = isinstance(key, rsa.RSAPrivateKey)
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=rsa_key, data_encipherment=False,
        key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _builder(subject: x509.Name, issuer: x509.Name, key: PrivateKey, start: _dt.datetime,
             days: int) -> x509.CertificateBuilder:  # fmt: skip
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - CLOCK_SKEW)
        .not_valid_after(start + _dt.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def make_bundle(
    *,
    dns: Sequence[str] = ("localhost",),
    ips: Sequence[str] = ("127.0.0.1",),
    client_name: str = "disque-client",
    days: int = 365,
    key_type: str = "ec",
    now: _dt.datetime | None = None,
) -> Bundle:
    """A new CA, and a node and a client certificate it signed, valid ``days`` days from
    ``now`` (default: the current time; tests pass a past time to get expired ones).

    The node certificate names ``dns`` and ``ips`` as subject alternative names (at least
    one of them is needed: clients check the name or address they connected to against
    them) and may be used both as a server and as a client (the cluster bus's mutual TLS).
    """
    if days < 1:
        raise CertError("--days must be 1 or more")
    dns_names = _check_dns(dns)
    addresses = parse_ips(ips)
    if not dns_names and not addresses:
        raise CertError("the node certificate needs at least one --dns name or --ip address")
    client_name = client_name.strip()
    if not client_name:
        raise CertError("the client certificate needs a name (--client-name)")
    start = now if now is not None else _dt.datetime.now(_dt.timezone.utc)
    if start.tzinfo is None:
        start = start.replace(tzinfo=_dt.timezone.utc)

    ca_key = new_key(key_type)
    ca_name = _name("disque-py CA %s" % secrets.token_hex(4))  # tells two CAs apart
    ca_cert = (
        _builder(ca_name, ca_name, ca_key, start, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
        ), critical=True)  # fmt: skip
        .sign(ca_key, hashes.SHA256())
    )
    ca = Issued(ca_cert, ca_key)
    authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())

    def leaf(common_name: str, usages: list[x509.ObjectIdentifier], san: list[x509.GeneralName]) -> Issued:
        key = new_key(key_type)
        builder = (
            _builder(_name(common_name), ca_name, key, start, days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_leaf_usage(key), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(authority, critical=False)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return Issued(builder.sign(ca_key, hashes.SHA256()), key)

    san: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    san += [x509.IPAddress(a) for a in addresses]
    node = leaf(dns_names[0] if dns_names else str(addresses[0]),
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], san)  # fmt: skip
    client = leaf(client_name, [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    files = {
        "ca.crt": ca.cert_pem(), "ca.key": ca.key_pem(),
        "node.crt": node.cert_pem(), "node.key": node.key_pem(),
        "client.crt": client.cert_pem(), "client.key": client.key_pem(),
    }  # fmt: skip
    return Bundle(ca, node, client, files)


def write_bundle(directory: str | os.PathLike, bundle: Bundle, *, force: bool = False) -> list[Path]:
    """Write the bundle's files into ``directory`` (made if missing) and return their paths.

    Without ``force`` nothing is written when any of :data:`FILES` is already there (a CA
    key replaced by mistake invalidates every certificate made from it). Each file is
    written to a temporary file and renamed over its name; keys are 0600, certificates 0644.
    """
    base = Path(directory)
    if base.exists() and not base.is_dir():
        raise CertError("%s exists and is not a directory" % base)
    targets = [base / name for name in FILES]
    present = [p for p in targets if p.exists() or p.is_symlink()]
    if present and not force:
        raise CertError(
            "%s already holds %s: not overwriting (pass --force to replace them; certificates signed by "
            "the old CA are no longer trusted where the new ca.crt is loaded)"
            % (base, ", ".join(p.name for p in present))
        )
    try:
        base.mkdir(parents=True, exist_ok=True)
        for path in targets:
            mode = 0o600 if path.suffix == ".key" else 0o644
            fd, tmp = tempfile.mkstemp(prefix="." + path.name + ".", dir=base)  # created 0600
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(bundle.files[path.name])
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, mode)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
    except OSError as exc:
        raise CertError("cannot write into %s: %s" % (base, exc.strerror or exc)) from None
    return targets
