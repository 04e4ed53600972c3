"""Rank-based tolerance protocol RTP for k-NN queries (Cheng et al. 2005 §4, Figure 5).

The server keeps a bound R halfway between the (k+r)-th and (k+r+1)-st nearest values, installed
on every stream, the set X of streams inside R (|X| ≤ k+r, exact because every stream reports a
crossing of R) and the answer A ⊆ X with |A| = k; every member of A then ranks k+r or better.
Maintenance (Figure 5): a stream of X−A leaving R leaves X (case 1); a member of A leaving R is
replaced by the member of X−A nearest q by its last known value (case 2); a stream entering R joins
X while |X| < k+r, otherwise the members of X and the newcomer are probed and R is redeployed from
their exact values (case 3). When X−A is empty in case 2 the server re-initialises by probing every
stream (the paper's step 5; its step 4, the expanding search with old scores, is not implemented).
"""
from backend.coordinator.tolerance.entity import EntityProtocol, QueryState, keyfn, region, inside


class _RtpState(QueryState):
    def __init__(self, proto, q):
        super().__init__(proto, q)
        self.k = q.extra["k"]
        self.r = q.extra.get("rank_tolerance", 0)
        self.score = keyfn(q.extra["point"])
        self.X = set()
        self.c = None

    def init(self, coord):
        self.ready = True
        self.deploy(coord, self.keys)

    def deploy(self, coord, exact):
        """Deploy_bound: A, X and R from the exact values of ``exact`` (which hold the k+r+1 nearest)."""
        kr = self.k + self.r
        scored = sorted((self.score(self.value(coord, key)), key) for key in exact)
        d = (scored[kr - 1][0] + scored[kr][0]) / 2
        self.c = region(self.q.extra["point"], d)
        self.A = {key for _, key in scored[:self.k]}
        self.X = {key for _, key in scored[:kr]}
        self.proto.stats["resolutions"] += 1
        for key in self.keys:
            self.constrain(coord, key, self.c)

    def update(self, coord, key):
        now = inside(self.c, self.value(coord, key))
        if key in self.X and not now:
            self.X.discard(key)
            if key in self.A:                                   # case 2
                self.A.discard(key)
                spare = self.X - self.A
                if spare:
                    self.A.add(min(spare, key=lambda s: (self.score(self.value(coord, s)), s)))
                else:                                           # step 5: re-initialise
                    self.probe(coord, self.keys, lambda c: self.deploy(c, self.keys))
        elif key not in self.X and now:                         # case 3
            if len(self.X) < self.k + self.r:
                self.X.add(key)
            else:
                exact = sorted(self.X | {key})
                self.probe(coord, exact, lambda c: self.deploy(c, exact))


class RTP(EntityProtocol):
    """Rank tolerance r for k-NN: answers are k streams that each rank k+r or better."""
    name = "rtp"
    kinds = ("knn",)
    State = _RtpState


PROTOCOLS = {"rtp": RTP}
