"""How every backend-side client reaches a broker (DESIGN.md §10 "Any broker"): where, who, TLS, client id.

The live coordinator, the Spark backend's bridge and publisher, the dashboard and ``quietfleet query``
connect the same way, to ``quietfleet broker``'s Mosquitto (its ``credentials.json``) or to an operator's
own broker (Mosquitto, EMQX, HiveMQ) with its own users, ACL and certificates:

* ``--broker-dir DIR`` / ``--credentials FILE``: ``quietfleet broker``'s ``credentials.json`` (fleet, host,
  port, the backend user's password; with ``--tls`` its TLS port and CA);
* ``--host``, ``--port`` (default 1883, 8883 with TLS), ``--user`` (default ``backend``), ``--password`` (or
  ``$QF_BROKER_PASSWORD``, which ``ps`` does not show), ``--fleet``;
* ``--tls-ca FILE`` (the CA that signed the broker's certificate), ``--tls`` (the system's CA store),
  ``--tls-cert FILE`` and ``--tls-key FILE`` (a client certificate, for brokers that ask for one);
* ``--client-id ID``: the MQTT client id of the command's session (drivers with several sessions derive
  the others from it, ``Access.client_id``).

Explicit options win over the credentials file. Every problem is a ``ValueError`` naming the option or
the file; ``where()`` (``host:port``) goes into every connection error.
"""
import json
import os

import paho.mqtt.client as mqtt

ENV_PASSWORD = "QF_BROKER_PASSWORD"
DEFAULT_USER = "backend"        # quietfleet broker's backend user (backend.live.broker.BACKEND_USER)
PORTS = (1883, 8883)            # MQTT's registered ports: plain, TLS


class Access:
    """A broker address and a login: ``host``, ``port``, ``user``, ``password``, ``tls`` (None, or a dict
    with ``ca``, ``cert``, ``key``, any of them None: None ``ca`` means the system's CA store),
    ``client_id`` (None: each client's default) and the ``fleet`` it serves."""

    def __init__(self, host="127.0.0.1", port=PORTS[0], user=DEFAULT_USER, password=None, tls=None, client_id=None,
                 fleet=None):
        self.host, self.port, self.user, self.password = host, port, user, password
        self.tls, self.client_id, self.fleet = tls, client_id, fleet

    def where(self):
        """``host:port`` (``[v6]:port``), for messages."""
        return "%s:%d" % ("[%s]" % self.host if ":" in self.host else self.host, self.port)

    def id_for(self, default, suffix=""):
        """The client id of one session: ``--client-id`` plus ``suffix`` when given, else ``default``."""
        return self.client_id + suffix if self.client_id else default

    def client(self, client_id, clean_session=True, **kw):
        """A paho client (MQTT 3.1.1) logged in and, with ``tls``, encrypted; not connected yet."""
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311,
                        clean_session=clean_session, **kw)
        configure(c, self.user, self.password, self.tls)
        return c

    def __repr__(self):
        return "Access(%s as %s%s)" % (self.where(), self.user, ", TLS" if self.tls else "")


def configure(client, user, password, tls):
    """Login and TLS of a paho client (``tls`` as in ``Access``)."""
    if user is not None:
        client.username_pw_set(user, password)
    if tls:
        client.tls_set(ca_certs=tls.get("ca"), certfile=tls.get("cert"), keyfile=tls.get("key"))


def add_options(p):
    """The broker options of a command (``quietfleet backend``, ``coordinator``, ``query``)."""
    p.add_argument("--broker-dir", help="the folder of `quietfleet broker` (its credentials.json)")
    p.add_argument("--credentials", help="a credentials.json as `quietfleet broker` writes it")
    p.add_argument("--fleet", help="fleet name: topics qf/<fleet>/... (default: the credentials')")
    p.add_argument("--host", help="broker host (default: the credentials', else 127.0.0.1)")
    p.add_argument("--port", type=int, help="broker port (default: the credentials', else 1883, with TLS 8883)")
    p.add_argument("--user", help="broker user name (default %s)" % DEFAULT_USER)
    p.add_argument("--password", help="the user's password (default: the credentials', else $%s)" % ENV_PASSWORD)
    p.add_argument("--tls", action="store_true",
                   help="connect with TLS, checking the broker's certificate against the system's CAs (or --tls-ca)")
    p.add_argument("--tls-ca", metavar="FILE", help="CA certificate(s) that signed the broker's (turns TLS on)")
    p.add_argument("--tls-cert", metavar="FILE", help="client certificate, for a broker that asks for one")
    p.add_argument("--tls-key", metavar="FILE", help="the client certificate's private key")
    p.add_argument("--client-id", help="MQTT client id (default: qf-<fleet>-<role>; see README, Your own broker)")


def from_args(args, default_port=None):
    """``Access`` from a command's options (``add_options``); sets ``args.fleet``. A ``credentials.json``
    lacking a key raises ``KeyError``; everything else wrong is a ``ValueError`` naming it."""
    g = lambda name: getattr(args, name, None)
    cred, path = None, g("credentials")
    if g("broker_dir"):
        if path:
            raise ValueError("give --broker-dir or --credentials, not both")
        path = os.path.join(g("broker_dir"), "credentials.json")
    if path:
        with open(path) as f:
            try:
                cred = json.load(f)
            except ValueError as e:
                raise ValueError("%s is not JSON: %s" % (path, e))
        if not isinstance(cred, dict):
            raise ValueError("%s is not a credentials object" % path)
    user = g("user") or DEFAULT_USER
    tls = tls_from(g("tls"), g("tls_ca"), g("tls_cert"), g("tls_key"))
    host, port, password = g("host"), g("port"), g("password")
    if cred is not None:
        args.fleet = g("fleet") or cred["fleet"]
        host = host or cred["host"]
        if port is None:
            port = cred["tls_port"] if tls and cred.get("tls_port") else cred["port"]
        if tls is not None and tls["ca"] is None and cred.get("ca"):
            tls["ca"] = cred["ca"]              # quietfleet broker --tls made its own CA
        if password is None:
            password = cred["users"].get(user)
    password = password if password is not None else os.environ.get(ENV_PASSWORD)
    if not g("fleet"):
        raise ValueError("give --fleet (or --broker-dir / --credentials)")
    if port is None:
        port = default_port or PORTS[tls is not None]
    if not 0 < port < 65536:
        raise ValueError("--port must be 1..65535, got %d" % port)
    if password is None:
        raise ValueError("no password for user %s: give --broker-dir or --credentials (quietfleet broker's), or "
                         "--host/--port/--user/--password (or $%s) for your own broker" % (user, ENV_PASSWORD))
    return Access(host or "127.0.0.1", port, user, password, tls, g("client_id") or None, args.fleet)


def tls_from(on, ca, cert, key, what=("--tls-ca", "--tls-cert", "--tls-key")):
    """The ``tls`` dict of ``Access`` (None: plain), each named file checked; ``what``: their option names."""
    if not (on or ca or cert or key):
        return None
    for name, path in zip(what, (ca, cert, key)):
        if path is not None and not os.path.isfile(path):
            raise ValueError("%s %s: no such file" % (name, path))
    if key and not cert:
        raise ValueError("%s needs %s" % (what[2], what[1]))
    return {"ca": ca, "cert": cert, "key": key}


def refused(access, reason):
    """The one line for a broker that refused a login (a bad user, password or ACL)."""
    return "the broker at %s refused user %s: %s" % (access.where(), access.user, reason)


def unreachable(access, error):
    """The one line for a broker that cannot be reached (nothing listening, TLS failing, a bad host)."""
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return "cannot reach the broker at %s: %s" % (access.where(), text)
