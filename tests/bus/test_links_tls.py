"""Bus links over mutual TLS (cluster_bus.tls.TlsTransport), two real ``Bus`` instances over
loopback: in a reactor (as in a node) and on the link's tasks, the secret inside TLS,
back-pressure (OpenSSL's partial writes retried), and handshakes that must fail."""

from __future__ import annotations

import ssl
import sys
from pathlib import Path

import pytest
import trio

from cluster_bus.links import Bus
from cluster_bus.tls import TlsTransport

from .test_links_reactor import A_ID, B_ID, Handler, Reactor, free_port, until

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tls_certs import _write_cert, _write_key, issue, make_ca, make_certs  # noqa: E402


@pytest.fixture(scope="module")
def contexts(tmp_path_factory):
    """(good, stranger): (server, client) context pairs; the stranger's certificate is of another CA."""
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    d = tmp_path_factory.mktemp("stranger")
    key, cert = issue(make_ca("stranger CA"), "stranger", server=True)
    other_cert, other_key = _write_cert(cert, d / "n.crt"), _write_key(key, d / "n.key")

    def pair(cert_file, key_file):
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(str(cert_file), str(key_file))
        server.load_verify_locations(str(certs.ca))
        server.verify_mode = ssl.CERT_REQUIRED
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False
        client.load_cert_chain(str(cert_file), str(key_file))
        client.load_verify_locations(str(certs.ca))
        return server, client

    return pair(certs.server_cert, certs.server_key), pair(other_cert, other_key)


async def start(nursery, ctx, *, reactor: bool, secret: bytes | None = None):
    handler = Handler()
    r = Reactor() if reactor else None
    bus = Bus(handler, host="127.0.0.1", port=free_port(), secret=secret, reactor=r,
              transport=TlsTransport(*ctx, local_address="127.0.0.1"))  # fmt: skip
    if r is not None:
        r.bus = bus
        nursery.start_soon(r.run)
    await nursery.start(bus.run)
    return bus, handler, r


@pytest.mark.parametrize("reactor", [True, False])
@pytest.mark.parametrize("secret", [None, b"s3cret"])
async def test_links_carry_everything_in_order_under_back_pressure(contexts, reactor, secret):
    good, _ = contexts
    async with trio.open_nursery() as nursery:
        a, ha, ra = await start(nursery, good, reactor=reactor, secret=secret)
        b, hb, rb = await start(nursery, good, reactor=reactor, secret=secret)
        a.connect(B_ID, "127.0.0.1", b.port)
        await until(ha, lambda: ha.up)
        link = ha.up[0][1]
        if rb is not None:
            rb.running = trio.Event()  # B stops reading: A's TLS writes come back "want write"
        chunk = b"x" * 60000
        a.hold()
        for i in range(200):  # ~12 MB
            assert a.send_data(link, A_ID, "TEST", [i, chunk])
        a.release()
        if ra is not None:
            with trio.fail_after(10):
                while True not in ra.writable_requests:
                    await trio.sleep(0.01)
            rb.running.set()
        await until(hb, lambda: len(hb.items) == 200, timeout=30)
        assert [body[0] for _, body in hb.items] == list(range(200))
        assert all(body[1] == chunk for _, body in hb.items)
        assert a.stats["tls_failures"] == b.stats["tls_failures"] == 0 and not ha.errors and not hb.errors
        if ra is not None:
            assert len(ra.handlers) == 1 and len(rb.handlers) == 1  # the TLS links are in the reactors
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("reactor", [True, False])
async def test_a_certificate_of_another_ca_fails_both_ways(contexts, reactor):
    good, stranger = contexts
    async with trio.open_nursery() as nursery:
        a, ha, ra = await start(nursery, good, reactor=reactor)
        s, hs, rs = await start(nursery, stranger, reactor=reactor)
        s.connect(A_ID, "127.0.0.1", a.port)  # it connects: A refuses its certificate
        await until(ha, lambda: ha.errors)
        a.connect(B_ID, "127.0.0.1", s.port)  # A connects: A refuses the certificate it is shown
        await until(ha, lambda: ha.failed == [B_ID])
        # with TLSv1.3 a client's handshake ends before the server has checked its certificate:
        # the stranger's own link may come up, then A's refusal closes it
        await until(hs, lambda: hs.failed == [A_ID] or (len(hs.up) == 1 and hs.up[0][1] in hs.down))
        assert not ha.up and not ha.items and not hs.items
        assert all(kind == "tls" for kind, _ in ha.errors)
        assert a.stats["tls_failures"] == 2
        assert any("CERTIFICATE_VERIFY_FAILED" in reason for _, reason in ha.errors)
        if ra is not None:
            assert not ra.handlers
        nursery.cancel_scope.cancel()


async def test_plain_bytes_on_a_tls_bus_close_that_link(contexts):
    good, _ = contexts
    async with trio.open_nursery() as nursery:
        b, hb, rb = await start(nursery, good, reactor=True)
        s = trio.socket.socket()
        await s.connect(("127.0.0.1", b.port))
        await s.send(b"\x00\x00\x00\x03\x93\x09\x09")
        with trio.fail_after(10):
            try:
                while await s.recv(4096):  # an alert perhaps, then the close
                    pass
            except ConnectionResetError:
                pass
        s.close()
        await until(hb, lambda: hb.errors)
        assert hb.errors[0][0] == "tls" and b.stats["tls_failures"] == 1 and not rb.handlers
        nursery.cancel_scope.cancel()
