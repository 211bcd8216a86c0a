"""Throwaway certificates for TLS tests, made at test time with ``cryptography``: a CA, a server certificate for
``localhost`` / 127.0.0.1 and client certificates (one from the CA, one from an unrelated CA). TESTS ONLY."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertPaths:
    """PEM files of one test PKI."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_client_cert: Path  # signed by another CA: a server that trusts ``ca`` must refuse it
    rogue_client_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1)))


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    cert = (_builder(cn, _name(cn), key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(cn: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
          server: bool) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    b = (_builder(cn, ca_cert.subject, key.public_key())
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                               else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                            critical=False)
    return key, b.sign(ca_key, hashes.SHA256())


def _write(folder: Path, stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[Path, Path]:
    crt, pem = folder / f"{stem}.crt", folder / f"{stem}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


def make_pki(folder: Path) -> CertPaths:
    """Write a fresh test PKI into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("compeer test CA")
    ca, _ = _write(folder, "ca", ca_key, ca_cert)
    server = _write(folder, "server", *_leaf("localhost", ca_key, ca_cert, server=True))
    client = _write(folder, "client", *_leaf("trainer", ca_key, ca_cert, server=False))
    rogue_key, rogue_ca = _ca("some other CA")
    rogue = _write(folder, "rogue-client", *_leaf("trainer", rogue_key, rogue_ca, server=False))
    return CertPaths(ca, *server, *client, *rogue)
