"""Per-device heartbeat and ack mode (DESIGN.md §4 bounded withdrawal): how long a loss can stay unseen.

* **Heartbeat B.** A device silent for B sends a ``mark`` (edge.core.delivery); the backend finds a lost
  last report from the mark's number and a device gone quiet when nothing comes for B + λ + margin. By
  default B is per device, ``AUTO`` × the mean interval between the instants it was heard sending numbered
  uplinks (uplinks less than ``DISTINCT`` apart are one instant; the current silence included), at least
  max(10·λ, LEAST) and at most 48.5 days (a device whose queried sources all serve lag queries alone, in
  segment mode, at most its shortest D: its final answers are due no sooner; one no query reads, 34 years:
  nothing over it is due), rounded to a power of 2 s; the device is told (in its ``config``)
  when that is more than twice its B (it has been quiet: fewer marks) or, once the network has shown a
  gap, less than a quarter of it (it talks: a loss is found sooner; on a clean network not worth a
  downlink), so a talking device never sends a mark and a quiet one sends few. Until a smaller B has surely reached the device (λ after its next uplink heard past
  the old B), the watchdog waits the old one; but a B above a cap that fell (a lag-free query came to the
  device, ``ceiling``) is waited within the cap at once. A mark from a device whose sources serve lag queries alone
  takes its B to its shortest D at once (the power of 2 at most D, within the cap): silent for a whole B, it
  has nothing due sooner, and ×4 per mark cost each such device of ozone-grid's mixed workload 10 marks and
  10 configs on its way to D. A number given as the setting fixes B for every device; 0 turns marks and the
  watchdog off.
* **Ack mode.** The first time a gap is seen on any device's link (the network loses or reorders), the
  backend sends every device a ``link`` with a resend timeout rto (a device born later gets it with its
  birth) and acknowledges its uplinks (``acks``: a ``nack`` at once for a gap, one cumulative ``ack`` once
  the device is quiet for the ack delay D, 0 by default: at once); a device resends its latest uplink not acknowledged after rto,
  then 3·rto, one followed by a later uplink at 3·rto (the gap's nack asks for it sooner), so a gap is
  waited for λ + 3·rto from when it was seen before it counts as lost. rto = D + R, D the ack delay and
  R the round trip: 2λ + RTO_MARGIN until the device's round trips are timed (a probe's reply, a report
  acknowledging a control), then twice the longest of the last RTTS + RTO_MARGIN, at least RTO_LEAST and
  at most 2λ + RTO_MARGIN: a resend should arrive before the queue releases the time of the report it
  replaces, so it is not even late (a longer R, 0.55 s on FINAL, resent 28 % fewer reports but withdrew
  twice the answers: a late report withdraws those since its time). The gap wait uses the largest rto told since the device's birth (the
  device may not have a smaller one yet). On a clean network no device is switched on.

``bound`` is what an answer states as ``withdraw_within``: the longest a wrong provisional answer over the
device's sources can stand before it is withdrawn (a loss unseen for B, found by the mark or the watchdog,
and the wait for a resend that never comes).
"""
import math

AUTO = 4.0              # B = AUTO × mean interval between uplinks
FLOOR = 10.0            # ... at least FLOOR·λ
LEAST = 4.0             # ... and at least this (s)
DISTINCT = 0.05         # s: uplinks heard closer than this are one instant (several sources reporting a reading)
MOST = 4.0 * 2 ** 20    # ... and at most 48.5 days (a capped B out-talks a device quieter than the cap: a week
                        # made a device reporting every 17 days send 2-3 marks per report)
LONGEST = 4.0 * 2 ** 28  # 34 years: the longest B a config's beat carries (codec.beat_field), a lag-only device's cap
START = 30.0            # B before a device's uplinks have been timed
RING = 32               # arrivals timed per device
RTO_MARGIN = 0.05       # s added to the round trip R for the resend timeout
RTO_LEAST = 0.1         # s: the shortest round trip R
RTTS = 8                # round trips timed per device
TRIES = 3               # a gap is waited for λ + 3·rto: the device's first two resends (rto, 3·rto: edge.core.delivery)


class Heartbeats:
    def __init__(self, beat, latency, net, margin, delay=0.0):
        self.auto = beat is None
        self.fixed = 0.0 if beat is None else beat
        self.latency = latency          # the queue's λ (with the skew it covers)
        self.net = net                  # λ of the network alone (the round trip is at most 2·net)
        self.margin = margin
        self.delay = delay              # the ack delay D (``acks``): a quiet device's ack comes D after its uplink
        self.rto = delay + 2 * net + RTO_MARGIN
        self.lossy = None               # when a gap was first seen on any link (ack mode for every device)
        # device -> [B told, B waited, arrivals, ack mode since or None, B told when, rto told, rto waited, rtts]
        self.dev = {}
        self.lag = {}       # device -> its shortest D, when its sources serve lag queries alone (``ceiling``)
        self.stats = {"acked": 0, "links": 0, "beats": 0}

    def first(self):
        """B of a device not timed yet (the fixed B, or START within the bounds)."""
        return _pow2(min(max(START, FLOOR * self.latency, LEAST), MOST)) if self.auto else self.fixed

    def _d(self, device):
        d = self.dev.get(device)
        if d is None:
            b = self.first()
            d = self.dev[device] = [b, b, [], self.lossy, None, self.rto, self.rto, []]
        return d

    def beat(self, device):
        """B as the watchdog waits it (and answers state it): the B told, or the larger one told before
        while the config telling it may not have arrived."""
        return self._d(device)[1]

    def told(self, device):
        """The B to put in ``device``'s config (recorded as told)."""
        return self._d(device)[0]

    def heard(self, device, now, numbered):
        """An uplink from ``device`` heard at ``now`` (``numbered``: not a mark). Returns (B waited before,
        whether B moved by more than 2× and the device is to be told)."""
        d = self._d(device)
        was = d[1]
        if d[1] != d[0] and now >= d[4] + d[1] + self.latency:
            d[1] = d[0]             # past the old B: the config telling the new one has reached it
        ring = d[2]
        if numbered and not (ring and now - ring[-1] < DISTINCT):
            ring.append(now)
            if len(ring) > RING:
                del ring[0]
        n = len(ring) - (0 if ring and now - ring[-1] >= DISTINCT else 1)     # intervals timed (the silence too)
        if not self.auto or n < 1:
            return was, False
        mean = (now - ring[0]) / n
        lag = self.lag.get(device)
        cap = _cap(lag)
        top = _pow2(cap, cap)
        raw, most = min(max(AUTO * mean, FLOOR * self.latency, LEAST), cap), cap
        if not numbered and lag is not None and raw < lag:
            raw = most = min(lag, cap)      # (a lag-only device's mark: B to its D at once, not ×4 per mark)
        if raw > 2 * d[0] or raw >= top > d[0] or d[0] > top or (4 * raw < d[0] and self.lossy is not None):
            fell = d[0] > top               # (its cap fell: waited at once, see ``ceiling``)
            b = d[0] = _pow2(raw, most)     # (B: a power of 2)
            d[4] = now
            d[1] = b if fell else max(d[1], b)
            self.stats["beats"] += 1
            return was, True
        return was, False

    def ceiling(self, device, d):
        """``device``'s cap on B: ``d`` s (its sources serve lag queries alone, the shortest D among them: no
        final answer over it is due sooner; ``math.inf`` when no query reads it: none is, LONGEST) when longer
        than MOST, else MOST (None: it serves a lag-free query). A lower cap is waited at once (the answers of
        the query that brought it state it from the first) and told with the device's next uplink (its reply
        to that query's control), B within it then waited at once too: were that config lost, the device
        would be found silent within it and asked for a birth, never waited longer than the answers state.
        Returns the B waited before when it fell, else None."""
        if d is None:
            self.lag.pop(device, None)
        else:
            self.lag[device] = d
        e = self.dev.get(device)
        cap = _cap(d)
        if self.auto and e is not None and e[1] > cap:
            was, e[1] = e[1], _pow2(cap, cap)
            return was
        return None

    def idle(self, device):
        """Whether no query reads ``device`` (its cap is ``ceiling``'s for ever)."""
        return self.lag.get(device) == math.inf

    # -- ack mode ----------------------------------------------------------------------------
    def acking(self, device):
        d = self.dev.get(device)
        return d is not None and d[3] is not None

    def switch_on(self, device, now):
        """A gap on ``device``'s link: the devices to switch to ack mode now (every one known, the first
        time; the caller sends each a ``link``)."""
        self._d(device)
        if self.lossy is not None:
            return []
        self.lossy = now
        for d in self.dev.values():
            d[3] = now
        self.stats["links"] += len(self.dev)
        return list(self.dev)

    def wait(self, device, sent):
        """How long a gap is waited for before it counts as lost: λ, or λ + 3·rto for an uplink the device
        kept (sent, event time ``sent``, once the ``link`` had surely reached it)."""
        d = self.dev.get(device)
        if d is None or d[3] is None or sent < d[3] + self.net:
            return self.latency
        return self.latency + TRIES * d[6]

    def timeout(self, device):
        """The resend timeout to tell ``device`` (recorded as told)."""
        d = self._d(device)
        d[6] = max(d[6], d[5])
        return d[5]

    def born(self, device):
        """A birth: from now on the device waits what it is told next (a reboot forgot the rest)."""
        d = self._d(device)
        d[6] = d[5]

    def timed(self, device, rtt):
        """A round trip of ``rtt`` s to ``device`` and back; True when its rto is to be told anew."""
        d = self._d(device)
        d[7].append(rtt)
        del d[7][:-RTTS]
        want = self.delay + min(max(2 * max(d[7]) + RTO_MARGIN, RTO_LEAST), 2 * self.net + RTO_MARGIN)
        if not (want < 0.5 * d[5] or want > 1.5 * d[5]):
            return False
        d[5] = want
        return d[3] is not None

    def trip(self, device):
        """R, the round trip to ``device`` its rto allows for (a gap is nacked again after it)."""
        return self._d(device)[5] - self.delay

    def bound(self, b):
        """The longest a wrong provisional answer over a device of heartbeat ``b`` stands (an answer's
        ``withdraw_within``): a loss unseen for B, then the watchdog's wait or a gap's in ack mode."""
        return b + 2 * self.latency + self.margin + TRIES * self.rto


def _cap(lag):
    """The cap on B of a device whose shortest D is ``lag`` (None: it serves a lag-free query; ``ceiling``)."""
    return MOST if lag is None or lag <= MOST else min(lag, LONGEST)


def _pow2(b, most=MOST):
    """``b`` rounded to a power of 2 (s) within [LEAST, ``most``]: a device's B takes few values."""
    p = LEAST
    while p * 1.5 < b and p * 2 <= most:
        p *= 2
    return p
