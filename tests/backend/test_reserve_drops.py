"""The clock-skew reserve rises on its last two epochs and falls only on its last DROPS
(backend/coordinator/core/reserve.py), against a batch recomputation from the log of what it was shown, and
across protocols: the same readings and clocks give adaptive and deadband the same reserve, and given deadband's
reserve adaptive pays no more than deadband's run plus its loan."""
import copy
import math
import random

from backend.coordinator.core import reserve
from backend.coordinator.core.queries import parse_query
from backend.coordinator.core.reserve import BINS, CAP, COUNT, DROPS, EPOCH, FIRST, MARGIN, PRIOR, STEP, Reserve


def query(precision=10.0):
    return parse_query({"id": "q", "kind": "sum", "sources": ["a", "b"], "precision": precision}, ["a", "b"])


def batch(log, d, prior):
    """R of the query after each entry of ``log`` ([(t, excess, final)]), recomputed from the log in one pass:
    each stream's epochs (COUNT answers or EPOCH s; the provisional stream's first after FIRST) kept as lists,
    each epoch end's quantile by sorting (the bin holding the answer of that rank, its upper edge), a rise to the
    last two epochs' value, a drop only to the last DROPS epochs'; the query's R the larger stream's."""
    def quantile(eps, final):
        got = sorted(v for e in eps for v in e)
        share = reserve.QUANTILE * len(got)
        v = got[max(0, math.ceil(share) - 1)]
        k = 0 if v <= 0 else min(BINS, 1 + int(v / d * BINS))
        return min(CAP * d, k * d / BINS + (MARGIN * d if final else 0.0))

    out, value = [], {False: 0.0, True: prior}
    epochs, cur, end = {False: [], True: []}, {False: [], True: []}, {}
    for t, x, final in log:
        end.setdefault(final, t + EPOCH)
        cur[final].append(x)
        if len(cur[final]) >= (FIRST if not final and not epochs[final] else COUNT) or t >= end[final]:
            eps = epochs[final]
            eps.append(cur[final])
            cur[final], end[final] = [], t + EPOCH
            rise, fall = quantile(eps[-2:], final), quantile(eps[-DROPS:], final)
            if rise > value[final] + STEP * d:
                value[final] = rise
            elif fall < value[final] - STEP * d:
                value[final] = fall
        out.append(max(value.values()))
    return out


PHASE = 2 * DROPS * COUNT     # answers of each stream per phase: 2·DROPS finals epochs


def test_the_reserve_on_every_prefix_equals_its_batch_recomputation():
    # a skewed burst, calm, a second burst, calm again: the provisional and the final stream, one answer of each
    # every 0.1 s (the provisional answers' excess is what the finals' is, less); both rise within two epochs of a
    # burst and fall only DROPS epochs after one
    rng = random.Random(11)
    d = 10.0
    r, q = Reserve(), query(d)
    r.begin(q, True)
    log, online = [], []
    for k in range(4 * PHASE):
        t = k / 10
        burst = k // PHASE in (0, 2)
        fin = rng.uniform(0.0, 3.0 if burst else 0.8) if rng.random() < 0.3 else 0.0
        for x, final in ((fin / 2, False), (fin, True)):
            r.observe(q, t, d + x - r.widths("q", t), final)     # measured against the R in force
            log.append((t, x, final))
            online.append(r.get("q"))
    want = batch(log, d, PRIOR * d)
    assert online == want
    moves = [b - a for a, b in zip(online, online[1:]) if a != b]
    assert sum(m > 0 for m in moves) >= 2 and sum(m < 0 for m in moves) >= 2, moves    # both ways, twice


def test_a_drop_waits_for_drops_epochs_a_rise_does_not():
    r, q = Reserve(), query(10.0)
    t = 0.0
    for k in range(FIRST):                                  # the first provisional epoch: excess 3
        r.observe(q, t, 13.0)
        t += 0.01
    high = r.get("q")
    assert high >= 3.0
    for e in range(DROPS):                                  # calm: R stays while the burst is in the window
        for _ in range(COUNT):
            t += 0.01
            r.observe(q, t, 10.0 - r.get("q"))
        assert r.get("q") == (high if e < DROPS - 1 else 0.0), (e, r.get("q"))
    assert DROPS >= 4       # (main at 37da0e2 fell after the burst's second calm epoch, whatever came next)
    for _ in range(COUNT):                                  # a burst: up within the epoch it ends
        t += 0.01
        r.observe(q, t, 10.0 + 2.0)
    assert 2.0 <= r.get("q") <= 2.0 + 10.0 / BINS + 1e-12


def _skewed(protocol, seed, duration):
    from backend.bench.faults import FINAL
    from backend.sim import engine
    w = copy.deepcopy(dict(FINAL, seed=seed, duration=duration))
    w.update(name="f", protocol=protocol, network=dict(w["network"], skew=0.3))
    moves = []
    sim = engine.simulation(w)
    observe = sim.coord.reserve.observe

    def logged(q, t, width, final=False):
        moved = observe(q, t, width, final)
        if moved:
            moves.append((q.id, sim.coord.reserve.get(q.id)))
        return moved
    sim.coord.reserve.observe = logged
    res = sim.run()
    assert res["violations"] == 0 and res["precision_misses"] == 0
    return res["messages"]["up"] + res["messages"]["down"], moves


def test_the_same_readings_and_clocks_give_both_protocols_the_same_reserve():
    # dev seed 1018, skew alone (no loss: the runs are deterministic, a difference is systematic). Main at
    # 37da0e2: the SUM's reserve went 15 -> 11.25 -> 14.06 -> 11.25 in adaptive's run and 15 -> 12.19 in
    # deadband's (each learnt from its own answers' heaviest excess over two ~15 s epochs), and adaptive sent
    # 11,630 messages against 11,441 (+189, loan 20). Oracle: the deadband run, move for move
    got = {p: _skewed(p, 1018, 900) for p in ("adaptive", "deadband")}
    print("messages, reserve moves: %s" % got)
    assert got["adaptive"][1] == got["deadband"][1]
    assert got["adaptive"][0] <= got["deadband"][0] + 20, got


def test_given_deadbands_reserve_adaptive_pays_no_more_than_a_deadband_run():
    # the cross-run gap is the reserve alone: dev seed 1011 at skew 0.3 (no loss: deterministic runs). With the
    # finals' R their largest excess, one burst at t ~ 100 s left deadband's at 12.19 and adaptive's at 11.25, from
    # where later measures moved adaptive's six times between 11.25 and 14.06: adaptive 15,341 messages, deadband
    # 14,625 (+716, loan 20); adaptive replaying deadband's moves was within deadband's run plus its loan (-21).
    # Oracle: adaptive replaying deadband's moves (the query's R, at the first answer of the stream that moved it
    # from the move's event time on) is within deadband's run plus its loan: a reserve both share is all it needs
    from backend.bench.faults import FINAL
    from backend.sim import engine

    def run(protocol, replay=None):
        w = copy.deepcopy(dict(FINAL, seed=1011))
        w.update(name="f", protocol=protocol, network=dict(w["network"], skew=0.3))
        sim = engine.simulation(w)
        r, moves, todo = sim.coord.reserve, [], list(replay or ())
        learn = r.observe

        def observe(q, t, width, final=False):
            if replay is None:
                moved = learn(q, t, width, final)
                if moved:
                    moves.append((q.id, t, final, r.get(q.id)))
                return moved
            due = [m for m in todo if m[0] == q.id and m[2] == final and m[1] <= t][:1]
            if not due:
                return False
            todo.remove(due[0])
            was = r.get(q.id)
            r.value[(q.id, False)], r.value[(q.id, True)] = 0.0, due[0][3]    # (the query's R, as one stream)
            if r.get(q.id) == was:
                return False
            r.rise[q.id] = [None, r.get(q.id) > was, r.get(q.id)]      # (as ``observe`` after a move)
            return True
        r.observe = observe
        res = sim.run()
        assert res["violations"] == 0 and res["precision_misses"] == 0
        return res["messages"]["up"] + res["messages"]["down"], moves, todo

    dead, moves, _ = run("deadband")
    adaptive, _, left = run("adaptive", moves)
    print("deadband %d (reserve moves %s), adaptive with deadband's reserve %d" % (dead, moves, adaptive))
    assert len(moves) >= 2 and not left
    assert adaptive <= dead + 20


def _own(protocol, seed, faults):
    """FINAL (1,200 s) at ``seed`` on ``faults``, its reserve learnt from its own answers: messages but ack mode's
    delivery traffic (acks, nacks, resends: a lossy network drops a different draw of them in each run)."""
    from backend.bench.faults import FINAL, run
    spec = copy.deepcopy(dict(FINAL, seed=seed))
    res = run("final-%d" % seed, spec, protocol, faults)
    assert res["violations"] == 0 and res["final_wide_unsaid"] == 0
    return res["messages"]["up"] + res["messages"]["down"] - res["delivery"], res["final_wide"][0]


def test_each_run_learning_its_own_reserve_adaptive_pays_no_more_than_a_deadband_run():
    # the finals' R is their 99th percentile excess plus the margin, not their largest: the largest of a heavy
    # tail is what one run's finals reach and another's miss. With the largest, seed 1011 at skew 0.3 alone:
    # adaptive +716 (above); seed 3002 with the faults: adaptive's largest 8.45 at 78 s and 11.29 at 94 s,
    # deadband's 7.38 over the whole run, so adaptive's R rose 10.31 -> 13.12 -> 15.94 of δ = 60 and deadband's
    # stayed: +1,704 messages but ack traffic (+3,857 all told). Oracle: each deadband run, plus the loan
    from backend.bench.faults import FAULTS
    for seed, faults in ((1011, {"skew": 0.3}), (3002, FAULTS)):
        got = {p: _own(p, seed, faults) for p in ("adaptive", "deadband")}
        print(seed, got)
        assert got["adaptive"][0] <= got["deadband"][0] + 20, (seed, got)
        assert got["adaptive"][1] == got["deadband"][1] == 0.0, (seed, got)     # no final wider than δ
