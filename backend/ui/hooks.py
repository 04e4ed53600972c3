"""How each driver starts its dashboard (``--ui [HOST:]PORT``): one call per driver, so the drivers carry
a line or two each (marked ``# --ui``) and everything else stays in ``backend/ui``."""
from backend.ui.providers import BackendTotals, CoordinatorTotals, DemoTotals
from backend.ui.server import start_for

HELP = "serve the live dashboard on [HOST:]PORT (host default 127.0.0.1; the page has no login: keep it local)"


def add_option(parser):
    """``--ui`` on a driver's command line."""
    parser.add_argument("--ui", metavar="[HOST:]PORT", help=HELP)


def _login(acc):
    """The dashboard's login from the driver's ``backend.live.access.Access``: same user and TLS, its own
    client id (``--client-id`` + ``-ui``)."""
    return dict(user=acc.user, tls=acc.tls, client_id=acc.client_id and acc.client_id + "-ui")


def coordinator(args, live, acc, specs=(), out=print):
    """``quietfleet coordinator --ui``: totals from the coordinator's counters (and adaptive's deadband
    estimate); the ``--query`` specs are shown at once (their retained spec topics follow)."""
    return start_for(getattr(args, "ui", None), acc.fleet, acc.host, acc.port, acc.password, out=out,
                     provider=CoordinatorTotals(live), specs=specs, **_login(acc))


def backend(args, service, acc, out=print):
    """``quietfleet backend --ui``: totals from the job's ``status.json``."""
    return start_for(getattr(args, "ui", None), service.fleet, acc.host, acc.port, acc.password, out=out,
                     provider=BackendTotals(service), **_login(acc))


def demo(ui, broker, observer, devices, out=print):
    """``quietfleet demo --ui``: samples and the offline deadband replay from the agents' logs, once
    ``dashboard.provider.start(t, queries)`` says the filters are installed."""
    return start_for(ui, broker.fleet, broker.host, broker.port, broker.credentials("backend")[1], out=out,
                     provider=DemoTotals(observer, devices))
