"""Certificates for the TLS tests, made with ``cryptography``: a CA, a server certificate for
127.0.0.1/localhost, client certificates (one expired), and a second, unrelated CA."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import ipaddress

__all__ = ["Certs", "make_certs", "issue"]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key, path: Path, password: bytes | None = None) -> Path:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc))
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def make_ca(cn: str):
    key = _key()
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(ca, cn: str, *, server: bool, key=None, expired: bool = False):
    ca_key, ca_cert = ca
    key = key or _key()
    now = dt.datetime.now(dt.timezone.utc)
    if expired:
        before, after = now - dt.timedelta(days=10), now - dt.timedelta(days=1)
    else:
        before, after = now - dt.timedelta(days=1), now + dt.timedelta(days=30)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(before)
        .not_valid_after(after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            # a node's certificate serves both sides of a link between nodes
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server
                                  else [ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


@dataclass
class Certs:
    dir: Path
    ca: Path  # the CA everything below is signed by
    server_cert: Path
    server_key: Path
    server_cert2: Path  # another server certificate for the same key (reload tests)
    server_key_encrypted: Path  # server_key under PASSWORD
    client_cert: Path
    client_key: Path
    expired_cert: Path  # a client certificate that expired yesterday
    expired_key: Path
    other_ca: Path  # an unrelated CA
    other_client_cert: Path  # signed by other_ca
    other_client_key: Path
    serial: int  # server_cert's serial number
    serial2: int  # server_cert2's

    PASSWORD = b"s3cret pass"


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca("disque-py test CA")
    other = make_ca("unrelated CA")
    skey, scert = issue(ca, "disque-py node", server=True)
    _, scert2 = issue(ca, "disque-py node (renewed)", server=True, key=skey)
    ckey, ccert = issue(ca, "client", server=False)
    ekey, ecert = issue(ca, "expired client", server=False, expired=True)
    okey, ocert = issue(other, "stranger", server=False)
    d = directory
    return Certs(
        dir=d,
        ca=_write_cert(ca[1], d / "ca.crt"),
        server_cert=_write_cert(scert, d / "server.crt"),
        server_key=_write_key(skey, d / "server.key"),
        server_cert2=_write_cert(scert2, d / "server2.crt"),
        server_key_encrypted=_write_key(skey, d / "server-enc.key", Certs.PASSWORD),
        client_cert=_write_cert(ccert, d / "client.crt"),
        client_key=_write_key(ckey, d / "client.key"),
        expired_cert=_write_cert(ecert, d / "expired.crt"),
        expired_key=_write_key(ekey, d / "expired.key"),
        other_ca=_write_cert(other[1], d / "other-ca.crt"),
        other_client_cert=_write_cert(ocert, d / "other.crt"),
        other_client_key=_write_key(okey, d / "other.key"),
        serial=scert.serial_number,
        serial2=scert2.serial_number,
    )
