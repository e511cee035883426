"""AMQP over TLS (amqps): pika connects with TLS; a plain AMQP client on the TLS port fails cleanly."""

from __future__ import annotations

import datetime
import ssl

import pika
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from raftmq.ops.local.node import RaftmqNode, free_port


def self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def tls_node(tmp_path, broker):
    if broker.kind != "raftmq":
        pytest.skip("raftmq's TLS configuration")
    cert, key = self_signed(tmp_path)
    tls_port = free_port()
    node = RaftmqNode(tmp_path / "n", extra_args=["--tls-port", str(tls_port), "--tls-cert", str(cert),
                                                  "--tls-key", str(key)])
    node.tls_port, node.cert = tls_port, cert
    with node:
        yield node


def test_pika_over_tls(tls_node):
    context = ssl.create_default_context(cafile=str(tls_node.cert))
    params = pika.ConnectionParameters("localhost", tls_node.tls_port,
                                       ssl_options=pika.SSLOptions(context, "localhost"))
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"secret")
    method, _props, body = ch.basic_get(q, auto_ack=True)
    conn.close()
    assert body == b"secret"


def test_plain_amqp_on_the_tls_port_fails_cleanly(tls_node):
    params = pika.ConnectionParameters("127.0.0.1", tls_node.tls_port, connection_attempts=1, socket_timeout=3)
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params)
    # and the node is fine: plain port and TLS port still serve
    conn = pika.BlockingConnection(pika.URLParameters(tls_node.url))
    conn.close()
