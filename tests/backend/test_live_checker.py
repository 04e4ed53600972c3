"""The live demo's checker (``backend.live.checker.violations``) against a gateway's ground truth, where a backlog of
board frames read at once is stamped with one time: the last sample at a time is the value from then on."""
from backend.live import checker
from edge.runtime.gateway import bridge as br

QUERY = {"id": "q", "kind": "avg", "sources": ["s_b0"], "precision": 1.0}


def _truth(frames):
    """The gateway's truth rows (as ``gateway.Gateway.act`` logs them) for ``frames`` [(arrival, tick, units)]."""
    b = br.Bridge("s_b0", 1)
    rows = []
    for n, (now, tick, units) in enumerate(frames, start=1):
        for a in b.from_device(now, br.frame("V %d %d %d" % (n, tick, units)).rstrip(b"\n")):
            if a[0] == "sample":
                rows.append((a[1], "s_b0", a[2] / br.SCALE))
    return rows


def _answer(t, centre):
    return {"time": t, "query": "q", "lo": centre - 0.5, "hi": centre + 0.5, "degraded": False}


def test_samples_a_gateway_stamps_alike_hold_in_log_order():
    # frames on time, then 12 s 0.3 s late (a loaded gateway: the tick offset follows after 10 s), then on
    # time again: the offset steps back and the next samples keep the last stamp (stamps never go backwards)
    values = [(i * 7) % 11 for i in range(150)]
    rows = _truth([(100.0 + i / 10 + (0.3 if 0 < i < 130 else 0.0), 100 * i, v * 1024) for i, v in enumerate(values)])
    times = [t for t, _, _ in rows]
    assert times == sorted(times)
    tied = max(set(times), key=times.count)
    same = [v for t, _, v in rows if t == tied]
    assert len(same) >= 3 and len(set(same)) == len(same)
    answers = [_answer(t, v) for t, _, v in rows]                   # the device's value after each sample
    end = times[-1] + 0.1
    assert checker.violations([QUERY], rows, answers, end)["q"][0] == 0
    for i, (t, _, v) in enumerate(rows[:-1]):
        if t == tied and v != same[-1]:                             # an earlier sample of the tie holding
            wrong = [a for a in answers if a["time"] != tied] + [_answer(tied, v)]
            wrong.sort(key=lambda a: a["time"])
            bad = {}
            assert checker.violations([QUERY], rows, wrong, end, bad)["q"][0] == 1
            assert bad == {"q": [(tied, v - 0.5, v + 0.5, same[-1])]}      # where, the answer and the truth
