"""Keys and certificates for a secure deployment: a CA, the SuperLink's TLS certificate, the SuperNodes' keys.

For a test deployment or a first real one: production sites usually take the SuperLink's certificate from their
own CA. Everything is written with the ``cryptography`` package Flower depends on:

- ``ca.crt`` / ``ca.key``: a self-signed certificate authority (give ``ca.crt`` to every SuperNode and to the
  machine that runs ``flwr run``; keep ``ca.key`` offline);
- ``server.pem`` / ``server.key``: the SuperLink's TLS certificate, signed by the CA, valid for the given host
  names and IP addresses;
- ``<node>`` / ``<node>.pub``: one SuperNode's EC key pair in OpenSSH format; the public key is registered with
  ``flwr supernode register <node>.pub <connection>``, the private key stays on the node.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 365


def _private_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP384R1())


def _write(path: Path, data: bytes, *, secret: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_certificates(directory: Path, hosts: list[str]) -> None:
    """Write ``ca.crt``, ``ca.key``, ``server.pem`` and ``server.key`` into ``directory``; the server certificate
    is valid for ``hosts`` (names or IP addresses, e.g. ``["localhost", "127.0.0.1"]``)."""
    if not hosts:
        raise ValueError("the SuperLink's certificate needs at least one host name or address")
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = _private_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedpeft deployment CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = _private_key()
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    directory = Path(directory)
    _write(directory / "ca.crt", ca.public_bytes(serialization.Encoding.PEM), secret=False)
    _write(directory / "ca.key", _pem_key(ca_key), secret=True)
    _write(directory / "server.pem", server.public_bytes(serialization.Encoding.PEM), secret=False)
    _write(directory / "server.key", _pem_key(server_key), secret=True)


def make_node_key(path: Path) -> Path:
    """Write a SuperNode's EC key pair: the private key at ``path``, the public key at ``path.pub`` (OpenSSH
    format, as ``flwr supernode register`` and ``flower-supernode --auth-supernode-*-key`` read them)."""
    key = _private_key()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    path = Path(path)
    _write(path, private, secret=True)
    _write(path.with_name(path.name + ".pub"), public + b"\n", secret=False)
    return path
