"""`specrt serve` over TLS (--ssl-certfile, --ssl-keyfile, --ssl-ca-certs, --ssl-cert-reqs, as
vLLM's): certificates made here by `openssl`, the real server on the tiny engines, real clients
(the openai SDK on an httpx client checking the test CA, http.client, raw TLS sockets)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.cli.test_serve import _answers, _chunked, _in_process, _reference, _serving, _until_queued
from tests.runtime.test_text import worded  # noqa: F401  (fixture: a word-level tiny pair)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", "-addext",
             "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _signed(d: Path, name: str, ca: str, usage: str) -> None:
    """``name``.pem signed by ``ca`` (its key ``name``.key); ``usage``: its extensions' last lines."""
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    (d / f"{name}.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                                   "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n" + usage)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    """A test CA (ca.pem) and, signed by it, the server's certificate for 127.0.0.1 and localhost
    (server.pem, server.key) and a client's (client.pem, client.key); another CA's client
    certificate (stranger.pem, stranger.key)."""
    d = tmp_path_factory.mktemp("certs")
    _ca(d, "ca")
    _ca(d, "other")
    _signed(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _signed(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _signed(d, "stranger", "other", "extendedKeyUsage=clientAuth\n")
    return d


def _client_context(certs: Path, who: str | None = None) -> ssl.SSLContext:
    """A client's context trusting the test CA, with ``who``'s certificate where given."""
    ctx = ssl.create_default_context(cafile=certs / "ca.pem")
    if who is not None:
        ctx.load_cert_chain(certs / f"{who}.pem", certs / f"{who}.key")
    return ctx


def _tls_server(engines, certs: Path, cert_reqs: int = 0):
    """A Server on ENGINES over TLS on a free port in this process: (app, httpd, url, its log)."""
    from specrt.tls import context

    tls = context(certs / "server.key", certs / "server.pem", certs / "ca.pem" if cert_reqs else None, cert_reqs)
    return _in_process(engines, tls=tls)


def _connect(port: int, ctx: ssl.SSLContext, **kw) -> ssl.SSLSocket:
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30), server_hostname="127.0.0.1",
                           **kw)


def _post(body: dict, path: str = "/v1/completions", version: str = "HTTP/1.1") -> bytes:
    data = json.dumps(body).encode()
    return b"POST %s %s\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        path.encode(), version.encode(), len(data), data)


def test_the_command_serves_https_to_the_openai_sdk(worded, certs):  # noqa: F811
    """`specrt serve --ssl-certfile --ssl-keyfile` says https:// and serves the openai SDK (its
    httpx client checking the server against the test CA) whole and streamed answers, the
    session's own; a plain HTTP request to the port is answered 400 saying to use https://
    (it was closed unanswered); with the SDK's connection kept idle, Ctrl-C stops it (exit 0),
    "stopped serving on https://"."""
    import openai

    p, line = _serving(worded, "--ssl-certfile", str(certs / "server.pem"), "--ssl-keyfile",
                       str(certs / "server.key"))
    try:
        base = line.split(" on ")[1].split(" ")[0]
        assert base.startswith("https://127.0.0.1:") and base.endswith("/v1"), line
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0,
                               http_client=openai.DefaultHttpxClient(verify=_client_context(certs), timeout=60))
        messages = [{"role": "user", "content": "w3 w5"}]
        want, _ = _reference(worded, messages, max_new_tokens=5)
        r = client.chat.completions.create(model="t", messages=messages, max_tokens=5)
        assert r.choices[0].message.content == want and r.usage.completion_tokens == 5, r
        streamed = client.chat.completions.create(model="t", messages=messages, max_tokens=5, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == want
        plain = base.replace("https://", "http://")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(plain + "/completions", data=b'{"prompt": "w1"}'),
                                   timeout=30)
        said = json.loads(e.value.read())["error"]
        assert e.value.code == 400 and "this port speaks HTTPS (TLS): send the request to https://" in said["message"]
        assert client.completions.create(model="t", prompt="w1 w2", max_tokens=2).usage.completion_tokens == 2
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 0
        assert p.stderr.read().strip().endswith(f"stopped serving on {base}")
        p.stderr.close()


def test_a_tls_connection_is_kept_and_pipelined_as_a_plain_one(worded, certs):  # noqa: F811
    """Over TLS as over plain HTTP: http.client's one connection carries a completion, a stream
    (chunked) and a GET after it; two requests pipelined in one write are answered in order; a
    client that pipelines two and then ends its side (close_notify, then its socket's SHUT_WR, as
    a half-close over TLS is said) gets both answers, and then the connection's end, the
    server's close_notify first (a client that takes an end without it for a cut reads a clean
    end)."""
    with _tls_server(worded, certs) as (app, httpd, url, logs):
        port = httpd.server_address[1]
        c = http.client.HTTPSConnection("127.0.0.1", port, context=_client_context(certs), timeout=30)
        socks = set()
        for body in ({"prompt": "w1 w2", "max_tokens": 3}, {"prompt": "w4", "max_tokens": 2, "stream": True}):
            c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            assert r.status == 200 and r.getheader("Connection") is None, (r.status, data)
            if body.get("stream"):
                assert r.getheader("Transfer-Encoding") == "chunked" and data.endswith(b"data: [DONE]\n\n"), data
            else:
                assert json.loads(data)["usage"]["completion_tokens"] == 3
            socks.add(id(c.sock))
        c.request("GET", "/health")
        r = c.getresponse()
        assert (r.status, json.loads(r.read())) == (200, {"status": "ok"}) and socks == {id(c.sock)}
        c.close()
        with _connect(port, _client_context(certs)) as s:  # pipelined
            s.sendall(_post({"prompt": "w4 w6", "max_tokens": 3}) + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            (h1, b1), (h2, b2) = _answers(s, 2)
            assert h1.startswith(b"HTTP/1.1 200") and json.loads(b1)["usage"]["completion_tokens"] == 3, (h1, b1)
            assert h2.startswith(b"HTTP/1.1 200") and json.loads(b2)["data"][0]["id"] == "tiny", (h2, b2)
            s.sendall(_post({"prompt": "w1", "max_tokens": 2, "stream": True}))  # (a stream's chunks, then on)
            head, pieces = _chunked(s)
            assert head.startswith(b"HTTP/1.1 200") and pieces[-1] == b"data: [DONE]\n\n", (head, pieces)
        s = _connect(port, _client_context(certs), suppress_ragged_eofs=False)
        try:  # pipelined, then half-closed
            s.sendall(_post({"prompt": "w1 w2", "max_tokens": 3}) + _post({"prompt": "w4", "max_tokens": 2}))
            s.settimeout(0)
            with pytest.raises(ssl.SSLWantReadError):  # (its close_notify sent; the server's not yet come)
                s.unwrap()
            s.settimeout(30)
            socket.socket.shutdown(s, socket.SHUT_WR)
            out = _to_end(s)
        finally:
            s.close()
        assert out.count(b"HTTP/1.1 200 ") == 2, out
        assert [json.loads(b)["usage"]["completion_tokens"] for _, b in _answers(_Bytes(out), 2)] == [3, 2]
        assert len(logs) == 6, logs  # (each completion run once)


def _to_end(s: ssl.SSLSocket) -> bytes:
    """What ``s`` (suppress_ragged_eofs=False) reads to the server's close_notify: an end without
    it raises SSLEOFError. (Where this side said its own end first, the server's reads as
    SSLZeroReturnError, not b"".)"""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ssl.SSLZeroReturnError:
        pass
    return out


class _Bytes:
    """What _answers reads, from bytes already read."""

    def __init__(self, data: bytes):
        self.data = data

    def recv(self, n: int) -> bytes:
        piece, self.data = self.data[:n], self.data[n:]
        return piece


def test_a_stream_to_an_http_1_0_client_ends_with_the_tls_close(worded, certs):  # noqa: F811
    """An HTTP/1.0 client's stream (and any answer) ends at the connection's close: over TLS the
    server says that end (close_notify) before closing, so a client that takes a close without
    it for a cut answer (OpenSSL 3's: curl's "unexpected eof while reading"; here
    suppress_ragged_eofs=False) reads the whole stream and a clean end: it got SSLEOFError."""
    with _tls_server(worded, certs) as (app, httpd, url, logs):
        for req in (_post({"prompt": "w4", "max_tokens": 3, "stream": True}, version="HTTP/1.0"),
                    b"GET /health HTTP/1.0\r\n\r\n"):
            with _connect(httpd.server_address[1], _client_context(certs), suppress_ragged_eofs=False) as s:
                s.sendall(req)
                out = _to_end(s)
            assert out.startswith(b"HTTP/1.1 200") and b"\r\nConnection: close\r\n" in out, out
            assert out.endswith(b"data: [DONE]\n\n" if b"stream" in req else b'{"status": "ok"}'), out


def test_a_silent_client_or_plain_http_on_the_tls_port_holds_no_one_else(worded, certs):  # noqa: F811
    """The handshake is done in the connection's own thread: a client that connects and sends
    nothing, and one that sent half a record, hold only theirs (done as the connection was
    taken, the first held the accept loop: every later client waited for it, forever with no
    timeout there). A plain HTTP request to the port is answered 400 in plain text saying to use
    https://, and the server goes on."""
    with _tls_server(worded, certs) as (app, httpd, url, logs):
        port = httpd.server_address[1]
        silent = socket.create_connection(("127.0.0.1", port), timeout=30)
        half = socket.create_connection(("127.0.0.1", port), timeout=30)
        half.sendall(b"\x16\x03\x01\x02\x00\x01")  # (a handshake record's head and one byte of 512)
        try:
            with _connect(port, _client_context(certs)) as s:  # (its handshake is answered all the same)
                s.sendall(_post({"prompt": "w1 w2", "max_tokens": 3}))
                (head, body), = _answers(s, 1)
                assert head.startswith(b"HTTP/1.1 200") and json.loads(body)["usage"]["completion_tokens"] == 3
            with socket.create_connection(("127.0.0.1", port), timeout=30) as plain:
                plain.sendall(_post({"prompt": "w1", "max_tokens": 2}))
                out = b""
                while chunk := plain.recv(65536):
                    out += chunk
            head, _, body = out.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400 ") and b"\r\nConnection: close" in head, out
            assert json.loads(body)["error"]["message"].startswith("this port speaks HTTPS (TLS)"), body
            c = http.client.HTTPSConnection("127.0.0.1", port, context=_client_context(certs), timeout=30)
            c.request("GET", "/health")
            assert c.getresponse().status == 200
            c.close()
        finally:
            silent.close()
            half.close()


def test_a_tls_client_that_left_while_waiting_is_not_run_and_counted_499(worded, certs):  # noqa: F811
    """A client that closed its TLS connection while its request waited for the engines is seen
    as gone (a TLS socket refuses MSG_PEEK: the look raised ValueError, read as "cannot tell",
    and the request was run for no one, counted 200): it is not run and counts 499."""
    with _tls_server(worded, certs) as (app, httpd, url, logs):
        real, runs = app.session.stream, []

        def counted(*a, **k):
            runs.append(1)
            return real(*a, **k)

        app.session.stream = counted
        with app.lock:
            s = _connect(httpd.server_address[1], _client_context(certs))
            s.sendall(_post({"prompt": "w4 w2", "max_tokens": 4}))
            _until_queued(app)
            s.close()
        deadline = time.time() + 30
        while not app.metrics.requests and time.time() < deadline:
            time.sleep(0.02)
        assert app.metrics.requests == {("completions", 499): 1} and not runs, (app.metrics.requests, runs)


@pytest.mark.parametrize("said", [False, True])
def test_a_tls_stream_whose_client_left_ends_as_a_client_that_left(worded, certs, said):  # noqa: F811
    """A stream whose client closed its TLS connection mid-answer (its end said with
    close_notify first or not) stops, logged as a client that left, no engine failure counted:
    the next write's TLS error (SSLEOFError, not the plain socket's BrokenPipeError) was taken
    for the engines' ("[error: SSLEOFError: ...]", engine_failures 1)."""
    with _tls_server(worded, certs) as (app, httpd, url, logs):
        real, gone = app.session.stream, threading.Event()

        def slow(*a, **k):  # (its pieces after the first once the client has gone: the head goes with the first)
            for i, piece in enumerate(real(*a, **k)):
                if i:
                    assert gone.wait(30)
                yield piece

        app.session.stream = slow
        s = _connect(httpd.server_address[1], _client_context(certs))
        s.sendall(_post({"prompt": "w1", "max_tokens": 40, "stream": True}))
        assert s.recv(12) == b"HTTP/1.1 200"
        if said:
            s.settimeout(0)
            with pytest.raises(ssl.SSLError):  # (sent; then the stream's data, or nothing yet, where the server's
                s.unwrap()  # close_notify is looked for)
        s.close()
        time.sleep(0.2)  # (its close come before the next write)
        gone.set()
        deadline = time.time() + 30
        while not logs and time.time() < deadline:
            time.sleep(0.02)
        assert len(logs) == 1 and "finish none: the client left" in logs[0], logs
        assert app.metrics.counts["engine_failures"] == 0


def test_a_tls_stream_whose_client_reads_nothing_ends_at_the_write_timeout(worded, certs):  # noqa: F811
    """--write-timeout holds over TLS: a stream whose client stopped reading (small buffers: its
    writes wait) ends after it, logged as a client that left, and the next request is served."""
    with _tls_server(worded, certs) as (app, httpd, url, logs):
        app.write_timeout = 1.0
        bound = httpd.RequestHandlerClass
        setup = bound.setup

        def small(self):
            setup(self)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

        bound.setup = small
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.settimeout(60)
        raw.connect(httpd.server_address)
        s = _client_context(certs).wrap_socket(raw, server_hostname="127.0.0.1")
        try:
            s.sendall(_post({"prompt": ["w1 w2", "w3 w5", "w6 w7", "w9 w8"], "n": 16, "logprobs": 20,
                             "max_tokens": 120, "temperature": 1.0, "seed": 1, "stream": True}))
            s.recv(1)  # its answer begun; nothing more is read
            c = http.client.HTTPSConnection("127.0.0.1", httpd.server_address[1], context=_client_context(certs),
                                            timeout=60)
            c.request("POST", "/v1/completions", body=json.dumps({"prompt": "w4", "max_tokens": 2}))
            assert c.getresponse().status == 200
            c.close()
        finally:
            s.close()
    assert any("64 choices" in line and "finish none: the client left" in line for line in logs), logs
    assert not any("[error" in line for line in logs), logs


@pytest.mark.parametrize("cert_reqs", [2, 1])
def test_client_certificates_are_asked_for_and_checked(worded, certs, cert_reqs):  # noqa: F811
    """--ssl-cert-reqs 2: a client without a certificate, or with one another CA signed, is
    refused at the handshake; one with the test CA's is answered. 1: a client without one is
    answered too, a stranger's still refused. The server goes on after each refusal."""
    with _tls_server(worded, certs, cert_reqs) as (app, httpd, url, logs):
        port = httpd.server_address[1]

        def health(who: str | None) -> int:
            c = http.client.HTTPSConnection("127.0.0.1", port, context=_client_context(certs, who), timeout=30)
            try:
                c.request("GET", "/health")
                return c.getresponse().status
            finally:
                c.close()

        for who, answered in ((None, cert_reqs == 1), ("stranger", False), ("client", True)):
            if answered:
                assert health(who) == 200, who
            else:
                with pytest.raises((ssl.SSLError, ConnectionError)):
                    health(who)


def _serve_error(*options: str, engines: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "specrt.cli", "serve", str(engines), "--port", "0", *options],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "SPECRT_THP": "0"})
    assert r.returncode == 1 and "Traceback" not in r.stderr, (options, r.returncode, r.stderr)
    return r.stderr


def test_tls_options_are_checked_before_the_engines_load_naming_option_and_file(certs, tmp_path):
    """Each wrong TLS option is refused with exit 1 and no traceback, naming the option and its
    file, before the engines are read (the folder here holds none: its error would come
    otherwise); an encrypted key is refused, not asked for on the terminal."""
    _openssl("pkey", "-in", "server.key", "-aes256", "-passout", "pass:x", "-out", "locked.key", cwd=certs)
    (tmp_path / "locked.pem").write_bytes((certs / "server.pem").read_bytes() + (certs / "locked.key").read_bytes())
    engines = tmp_path / "engines"
    engines.mkdir()
    key, cert, ca = str(certs / "server.key"), str(certs / "server.pem"), str(certs / "ca.pem")
    cases = [
        (("--ssl-keyfile", key), "--ssl-keyfile needs --ssl-certfile"),
        (("--ssl-ca-certs", ca), "--ssl-ca-certs needs --ssl-certfile"),
        (("--ssl-cert-reqs", "2"), "--ssl-cert-reqs needs --ssl-certfile"),
        (("--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-cert-reqs", "2"),
         "--ssl-cert-reqs 2 needs --ssl-ca-certs"),
        (("--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-cert-reqs", "3"),
         "--ssl-cert-reqs 3: expected 0, 1 or 2"),
        (("--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-cert-reqs", "two"), "'--ssl-cert-reqs'"),
        (("--ssl-certfile", str(tmp_path / "none.pem"), "--ssl-keyfile", key),
         f"--ssl-certfile {tmp_path / 'none.pem'}: cannot read it (No such file or directory)"),
        (("--ssl-certfile", cert, "--ssl-keyfile", str(tmp_path)), f"--ssl-keyfile {tmp_path}: cannot read it"),
        (("--ssl-certfile", key, "--ssl-keyfile", key), f"--ssl-certfile {key}: no certificate read from it"),
        (("--ssl-certfile", cert, "--ssl-keyfile", cert), f"--ssl-keyfile {cert}: no private key read from it"),
        (("--ssl-certfile", cert, "--ssl-keyfile", str(certs / "client.key")),
         f"--ssl-keyfile {certs / 'client.key'}: not the private key of --ssl-certfile {cert}'s certificate"),
        (("--ssl-certfile", cert), f"--ssl-certfile {cert}: no private key in it: give the certificate's key with "
                                   "--ssl-keyfile"),
        (("--ssl-certfile", cert, "--ssl-keyfile", str(certs / "locked.key")),
         f"--ssl-keyfile {certs / 'locked.key'}: the private key is encrypted"),
        (("--ssl-certfile", str(tmp_path / "locked.pem")), "the private key is encrypted"),
        (("--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-ca-certs", key, "--ssl-cert-reqs", "1"),
         f"--ssl-ca-certs {key}: no certificate read from it"),
    ]
    for options, said in cases:
        err = _serve_error(*options, engines=engines)
        assert said in err, (options, err)
    # the options right, the engines' own error comes (the TLS context was loaded first)
    err = _serve_error("--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-ca-certs", ca, "--ssl-cert-reqs", "2",
                       engines=engines)
    assert "ssl" not in err.lower(), err
    # a PEM holding both, as uvicorn (and so vLLM) takes --ssl-certfile alone
    both = tmp_path / "both.pem"
    both.write_bytes((certs / "server.pem").read_bytes() + (certs / "server.key").read_bytes())
    assert "ssl" not in _serve_error("--ssl-certfile", str(both), engines=engines).lower()
