"""Socket security: every peer must know the job token.

Default: ZeroMQ PLAIN checked by a ZAP handler (pyzmq's ``ThreadAuthenticator``)
with the token as the password. With ``curve=True`` traffic is also encrypted:
the server's and the clients' CURVE key pairs are derived from the token, so a
peer that knows the token can connect and nobody else can, without shipping
key files around. A peer that fails the handshake never sees a reply: ZeroMQ
drops the connection before any message reaches the server loop.
"""

from __future__ import annotations

import hashlib

import zmq
import zmq.auth.thread
from zmq.utils import z85

USERNAME = "distgnn"
_ZAP_DOMAIN = "distgnn"


def _keypair(token: str, role: str) -> tuple[bytes, bytes]:
    """``(public, secret)`` z85 CURVE keys derived from the token and a role name."""
    secret = z85.encode(hashlib.sha256(f"distgnn-curve-{role}:{token}".encode()).digest())
    return zmq.curve_public(secret), secret


class _CurveClientKey:
    """ZAP callback: accept exactly the client key derived from the token."""

    def __init__(self, client_public: bytes):
        self.client_public = client_public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.client_public


def secure_server(ctx: zmq.Context, socket: zmq.Socket, token: str, curve: bool) -> zmq.auth.thread.ThreadAuthenticator:
    """Start a ZAP authenticator for ``socket`` (call before ``bind``); stop it on exit."""
    auth = zmq.auth.thread.ThreadAuthenticator(ctx)
    auth.start()
    socket.zap_domain = _ZAP_DOMAIN.encode()
    if curve:
        public, secret = _keypair(token, "server")
        auth.configure_curve_callback(_ZAP_DOMAIN, _CurveClientKey(_keypair(token, "client")[0]))
        socket.curve_server = True
        socket.curve_publickey = public
        socket.curve_secretkey = secret
    else:
        auth.configure_plain(_ZAP_DOMAIN, {USERNAME: token})
        socket.plain_server = True
    return auth


def secure_client(socket: zmq.Socket, token: str, curve: bool) -> None:
    """Present the job's credentials on ``socket`` (call before ``connect``)."""
    if curve:
        public, secret = _keypair(token, "client")
        socket.curve_serverkey = _keypair(token, "server")[0]
        socket.curve_publickey = public
        socket.curve_secretkey = secret
    else:
        socket.plain_username = USERNAME.encode()
        socket.plain_password = token.encode()
