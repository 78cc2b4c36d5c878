"""TLS for ``specrt serve``: vLLM's --ssl-keyfile, --ssl-certfile, --ssl-ca-certs and
--ssl-cert-reqs read into a server-side ``ssl.SSLContext`` (as uvicorn, which vLLM hands them
to, makes it), each file checked by itself first so that a bad one is named.

The server (cmd_serve._HTTPServer) wraps each accepted socket without a handshake, which the
connection's own thread then does under its read timeout: a client that connects and says
nothing, or speaks plain HTTP to the port, holds its own thread only.
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from specrt.errors import UserError

CERT_REQS = {0: "CERT_NONE", 1: "CERT_OPTIONAL", 2: "CERT_REQUIRED"}  # --ssl-cert-reqs: Python's ssl.VerifyMode


def _read(option: str, path: Path) -> None:
    """Refuses a file that cannot be read, naming the option (load_cert_chain's own error
    names neither the option nor, for a key, which of the two files)."""
    try:
        path.read_bytes()
    except OSError as e:
        raise UserError(f"{option} {path}: cannot read it ({e.strerror or e})") from None


def _why(e: ssl.SSLError) -> str:
    """OpenSSL's reason, where it gives one ("PEM lib" names none), after a "; "."""
    return f"; {e.reason}" if e.reason else ""


def context(keyfile: Path | None, certfile: Path | None, ca_certs: Path | None,
            cert_reqs: int) -> ssl.SSLContext | None:
    """The server's TLS context, or None where no certificate is given (plain HTTP).

    ``certfile``: the server's certificate (PEM, its chain after it); ``keyfile``: its private
    key, unencrypted (left out: read from ``certfile``, as uvicorn reads a PEM holding both);
    ``ca_certs``: the CAs a client's certificate is checked against; ``cert_reqs``: 0 none is
    asked for, 1 one is checked if sent, 2 one is required."""
    if certfile is None:
        for option, given in (("--ssl-keyfile", keyfile), ("--ssl-ca-certs", ca_certs),
                              ("--ssl-cert-reqs", cert_reqs or None)):
            if given is not None:  # (uvicorn ignores the others without a certificate: served in plain HTTP)
                raise UserError(f"{option} needs --ssl-certfile (the server's certificate; TLS is off without it)")
        return None
    if cert_reqs not in CERT_REQS:  # (the option's own check says it first; this is the API's)
        raise UserError(f"--ssl-cert-reqs {cert_reqs}: expected 0, 1 or 2 (ssl.CERT_NONE, CERT_OPTIONAL, "
                        "CERT_REQUIRED)")
    if cert_reqs and ca_certs is None:  # (no CA loaded: every client certificate refused)
        raise UserError(f"--ssl-cert-reqs {cert_reqs} needs --ssl-ca-certs (the CAs a client's certificate is "
                        "checked against)")
    for option, path in (("--ssl-certfile", certfile), ("--ssl-keyfile", keyfile), ("--ssl-ca-certs", ca_certs)):
        if path is not None:
            _read(option, path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:  # the certificate alone first: an error after it is the key's
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=certfile)
    except ssl.SSLError as e:
        raise UserError(f"--ssl-certfile {certfile}: no certificate read from it (expected PEM: "
                        f"-----BEGIN CERTIFICATE-----{_why(e)})") from None
    named = f"--ssl-keyfile {keyfile}" if keyfile is not None else f"--ssl-certfile {certfile} (no --ssl-keyfile)"

    def encrypted() -> bytes:  # (OpenSSL would otherwise ask for the passphrase on the terminal)
        raise UserError(f"{named}: the private key is encrypted; give it unencrypted (`openssl pkey -in KEY -out "
                        "PLAIN`), as vLLM takes it (no passphrase option)")

    try:
        ctx.load_cert_chain(certfile, keyfile, password=encrypted)
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise UserError(f"--ssl-keyfile {keyfile}: not the private key of --ssl-certfile {certfile}'s certificate"
                            if keyfile is not None else
                            f"--ssl-certfile {certfile}: the private key in it is not its certificate's") from None
        if keyfile is None:
            raise UserError(f"--ssl-certfile {certfile}: no private key in it: give the certificate's key with "
                            "--ssl-keyfile") from None
        raise UserError(f"--ssl-keyfile {keyfile}: no private key read from it (expected a PEM private key: "
                        f"-----BEGIN ... PRIVATE KEY-----{_why(e)})") from None
    if ca_certs is not None:
        try:
            ctx.load_verify_locations(cafile=ca_certs)
        except ssl.SSLError as e:
            raise UserError(f"--ssl-ca-certs {ca_certs}: no certificate read from it (expected PEM{_why(e)})") from None
    ctx.verify_mode = ssl.VerifyMode(cert_reqs)
    ctx.set_alpn_protocols(["http/1.1"])  # (what is spoken: a client offering h2 as well knows at once)
    return ctx


def close_notify(sock: socket.socket) -> None:
    """Says the end of a TLS connection (its close_notify alert) without waiting for the
    client's: a body that ends at the close (a stream to an HTTP/1.0 client) is then whole to a
    client that takes an end without it for a cut (OpenSSL 3's, curl's: "unexpected eof while
    reading"). A connection whose handshake never ended, or whose client stopped reading, is
    closed without it."""
    if not isinstance(sock, ssl.SSLSocket):
        return
    try:
        sock.settimeout(0)  # (unwrap then sends its alert, and finds the client's not yet come: SSLWantReadError)
        sock.unwrap()
    except (OSError, ValueError):  # (ValueError: its TLS already dropped, by shutdown())
        pass


PLAIN_HTTP = ("this port speaks HTTPS (TLS): send the request to https:// (a plain HTTP request came to it)")


def plain_http_answer() -> bytes:
    """The answer to a plain HTTP request on the TLS port (nginx answers it so, where a client
    otherwise sees only a closed connection), with OpenAI's error object: written in plain text
    on the socket, the handshake having failed on the request's first bytes."""
    import json

    body = json.dumps({"error": {"message": PLAIN_HTTP, "type": "invalid_request_error", "param": None,
                                 "code": None}}).encode()
    return (b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (len(body), body))
