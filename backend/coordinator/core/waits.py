"""Controls and probes awaiting their effect (DESIGN.md §3; issue #20): a mixin of ``Integrity``.

An acknowledged control (a narrowing, a Cheng filter under a heartbeat, a control sent again) is
``expect``-ed back as a report carrying its epoch within 2λ + margin, a probe as its reply; unanswered
(``Integrity.due``), a probe is asked again and a control sent again to its source alone, waits doubling.
A filter the protocol counts on (FILTER) keeps its source ``unsure`` (answers degraded) until answered,
and a miss makes the device suspect ("control lost", revoked from when it left) until a report shows it
in force. A report still carrying an epoch older than a control sent long before (``unconfirmed``)
shows it lost, or the device's state lost: it is sent again (CHECK); unanswered twice, the device is
suspect ("lost state") and asked for a birth. When a downlink left is also what bounds a device's clock
from above (``offsets``): a report carrying its epoch, or a probe's reply, was sent after it arrived.
"""
from edge.core.codec import newer as epoch_newer

BACKOFF = 3600.0        # the longest wait between two requests (s)
CONTROL = "control lost"
LOST_STATE = "lost state"
# what a control that is never confirmed does (``expect``): RETRY sends it again (the mirror covers its
# loss); FILTER (the protocol counts on it) degrades the device, revokes, sends it again as CHECK; CHECK
# (sent again after a stale report or a FILTER miss) once more, then degrades, revokes and asks for a birth
RETRY, FILTER, CHECK = 0, 1, 2


def asked(key, epoch, probe=None):
    """What a report of ``key`` carrying ``epoch``, or a reply to ``probe``, answers: (the wait's key, its token)."""
    return (key, epoch) if probe is None else (("probe", key), probe)


class Waits:
    def capped(self, device, d, now):
        """``device``'s cap on its heartbeat B is now ``d`` (``Heartbeats.ceiling``); a B waited that fell (a
        lag-free query came to it) is awaited from ``now`` (when the query's controls have left, adapter clock):
        the device is heard within it (its reply to a control, then its marks) or found silent. Returns the B
        waited before when it fell, else None."""
        was, e = self.links.ceiling(device, d), self.dev.get(device)
        if was is not None and e is not None and e["last"] is not None:
            e["last"] = max(e["last"], now)         # (its silence counts from then; revoked from its latest stamp)
            self._arm(device, "beat", e["last"] + self.links.beat(device) + self.latency + self.margin)
        return was

    def sent(self, key, epoch, clock, unsafe=False, wall=None):
        """A control carrying ``epoch`` left for ``key``'s device once event time reached ``clock`` (the
        adapter's clock ``wall``); ``unsafe``: the protocol counts on it (answers are wrong while the device
        has not applied it)."""
        self.ctl[key] = (epoch, clock, unsafe)
        if wall is not None and self.left.get(key, (None,))[0] != epoch:    # (sent again under its epoch: a
            self.left[key] = (epoch, wall)          # report carrying it may answer the first, which bounds it)

    def echo(self, device, key, epoch, t, now, probe=None, prompt=False):
        """A report of ``key`` stamped ``t`` (device s) carrying ``epoch`` (or a reply to ``probe``) heard at
        ``now``: if a downlink assigned that epoch (asked that probe), the device sent it after that left;
        if it answered at once (a reply, or ``prompt``: a report acknowledging it), it timed a round trip."""
        what, token = asked(key, epoch, probe)
        at = self.left.pop(what, None)
        if at is not None and at[0] == token:
            self.offsets.echoed(device, t, at[1])
            if (probe is not None or prompt) and self.links.timed(device, now - at[1]):
                self.news["link"].append(device)

    def unconfirmed(self, key, epoch, t):
        """Whether a report of ``key`` stamped ``t`` (event time) still carries an epoch older than a
        control sent long enough before it to have arrived: the control was lost, or the device lost its
        state (a reboot whose birth was lost, which nothing else may show). Returns (the event time the
        control was sent, unsafe), else None; the coordinator sends it again (``expect`` CHECK)."""
        c = self.ctl.get(key)
        if c is None or not epoch_newer(c[0], epoch) or t <= c[1] + 2 * self.latency + self.margin:
            return None     # (it leaves λ after its event time at the latest, and arrives λ later)
        del self.ctl[key]
        return c[1], c[2]

    def expect(self, device, what, token, now, since=None, stage=RETRY, tries=0, unsafe=False):
        """``what`` left for ``device`` at ``now``: a source key's control under epoch ``token`` (answered
        by a report carrying it) or ``("probe", key)`` with probe id ``token`` (by its reply). Unanswered
        after 2λ + margin (doubling with ``tries``) it is ``due``; ``since``: from when answers are revoked
        then; ``stage``: what that does (RETRY, FILTER, CHECK); ``unsafe``: the key is ``unsure`` meanwhile
        (a filter the protocol counts on)."""
        if device in self.dev:
            self.waits.setdefault(device, {})[what] = (token, now, since, stage, tries, unsafe)
            self._arm(device, "wait", now + self._wait(tries))
            if unsafe:
                self.unsure[what] = None

    def _wait(self, tries):
        return min(self.retry * (1 << min(tries, 12)), BACKOFF)

    def answered(self, device, what, token):
        """An answer to ``what`` (``expect``); True when it ends the device's "control lost" suspicion."""
        waits = self.waits.get(device)
        w = waits.get(what) if waits else None
        if w is None or (w[0] != token if type(what) is tuple else epoch_newer(w[0], token)):
            return False
        del waits[what]
        self.unsure.pop(what, None)
        if self.suspect.get(device) == CONTROL and all(x[3] == RETRY for x in waits.values()):
            del self.suspect[device]
            self.need.pop(device, None)
            return True
        return False

    def forget(self, device, key):
        """A birth voids the controls sent to ``key`` before it (probes are asked again)."""
        self.ctl.pop(key, None)
        self.waits.get(device, {}).pop(key, None)
        self.unsure.pop(key, None)

    def _missed(self, device, now):
        """The waits of ``device`` over by ``now``, removed: [(device, what, wait)]; re-armed for the rest."""
        waits = self.waits.get(device, {})
        missed = []
        for what, w in [(what, w) for what, w in waits.items() if w[1] + self._wait(w[4]) <= now]:
            del waits[what]
            self.unsure.pop(what, None)
            missed.append((device, what, w))
        if waits:
            self._arm(device, "wait", min(w[1] + self._wait(w[4]) for w in waits.values()))
        return missed
