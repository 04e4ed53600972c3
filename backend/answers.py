"""How every driver writes an answer (DESIGN.md §3, §4): one record, one guarantee vocabulary, strict JSON.

``answer_record`` turns a coordinator's answer change into what the simulator's JSONL, the live
coordinator's retained payloads and the Spark job's answer table all carry: the change plus its
``guarantee`` (one word of ``GUARANTEES``) and ``final`` (DESIGN.md §4: true for a final answer, false for a
provisional one); ``error_record`` is what stands in for the answer of a refused or waiting spec;
``answer_json`` writes either as strict JSON (``strict``: non-finite numbers as strings).
"""
import json
import math

# What an answer guarantees (DESIGN.md §4): the word every driver writes in "guarantee".
GUARANTEES = {
    "interval": "the exact aggregate lies in [lo, hi]",
    "probabilistic": "the exact value lies in [lo, hi] with the stated confidence",
    "tolerance": "the members are within the query's rank or fraction tolerance",
    "degraded": "a source is offline, out of sync or its clock is off; see reason",
    "none": "no guarantee yet (no model or no reading)",
}


def guarantee(fields):
    """The guarantee word of an answer (one of ``GUARANTEES``): ``degraded``, else the protocol's own,
    else by its shape (``members``: a tolerance set, otherwise an interval)."""
    if fields.get("degraded"):
        return "degraded"
    word = fields.get("guarantee") or ("tolerance" if "members" in fields else "interval")
    if word not in GUARANTEES:
        raise ValueError("unknown guarantee %r (have: %s)" % (word, ", ".join(GUARANTEES)))
    return word


def answer_record(change):
    """One answer change as every driver writes it (JSONL line, retained payload, table row): the
    coordinator's fields plus ``guarantee``; a degraded answer always carries a ``reason``.

    Fields: ``time`` (event time from which it holds, until the query's next change of the same kind),
    ``query``, ``lo``/``hi`` or ``members``, ``degraded`` (true: no guarantee now; a source is offline, out
    of sync or its clock is off, see ``reason``), ``reason`` (``"lost uplink: d3; offline: s5; ..."``:
    the integrity findings of ``coordinator.core.integrity`` first — lost uplink, silent, rebooted,
    lost state, clock skew — then the offline widening), ``guarantee``, ``final`` and ``watermark``.

    Two kinds of answer (DESIGN.md §4). A **provisional** answer (``final: false``) is the real-time best
    answer; when late news shows earlier ones may have been wrong, a later one says ``revoked: [t0, t1]``:
    every provisional answer of this query holding within [t0, t1) (up to this change) is withdrawn and
    counts as degraded (issue #20). A **final** answer (``final: true``, ``coordinator.core.finals``) holds
    from ``time`` until the query's next final answer with bounds linear in time, [lo + dlo·(τ−time),
    hi + dhi·(τ−time)], and is never withdrawn; degraded, it says why (a source lost or offline there, or
    "wider than precision: width W, precision δ", also after another reason when a source is unknown and the
    answer still bounded: "lost uplink: d3; wider than precision: ..."). ``watermark`` is the query's final
    horizon when the answer was made: final answers exist for every time before it (null: none yet, or a family
    without final answers)."""
    rec = dict(change)
    rec["guarantee"] = guarantee(change)
    rec.setdefault("final", False)
    if rec["guarantee"] == "degraded":
        rec.setdefault("reason", "degraded by the protocol")
    return rec


def channel(rec):
    """The query topic channel a record is retained on: ``final`` for a final answer, else ``answer``."""
    return "final" if rec.get("final") else "answer"


def error_record(qid, message, now):
    """What a driver publishes for a refused or waiting spec (in place of the query's answer)."""
    return {"query": qid, "error": message, "time": now}


def answer_json(rec):
    """An answer change (``answer_record`` applied) or an ``error_record`` as JSON text: keys sorted,
    non-finite numbers as the strings ``"inf"``, ``"-inf"``, ``"nan"`` (strict JSON)."""
    return json.dumps(strict(rec if "error" in rec else answer_record(rec)), sort_keys=True)


def strict(x):
    """``x`` with every non-finite float replaced by ``"inf"``, ``"-inf"`` or ``"nan"`` (strict JSON)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict(v) for v in x]
    return x
