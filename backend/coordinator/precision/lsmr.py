"""Bit-reproducible LSMR (Fong & Saunders 2011) for Olston et al. 2003 App. B's burden targets.

SciPy's ``lsmr`` takes its vector norms from BLAS, whose reductions split differently with the
number of BLAS threads (and the CPU kernel), so the same system solved in another process (a Spark
Python worker, another ``OPENBLAS_NUM_THREADS``) differed in the last bits, and so did the widths
and answers that follow. This is the same algorithm (after SciPy's implementation, BSD licence,
with ``damp = 0``) with every reduction correctly rounded by ``math.fsum``; the rest is sparse
products (sequential loops) and element-wise arithmetic, which round the same everywhere.
"""
import math

import numpy as np


def norm(v):
    """The Euclidean norm of ``v``, correctly rounded whatever the order or the machine."""
    return math.sqrt(math.fsum((v * v).tolist()))


def _sign(a):
    return (a > 0) - (a < 0)


def _sym_ortho(a, b):
    """A stable Givens rotation: (c, s, r) with [c s; -s c]·[a; b] = [r; 0]."""
    if b == 0:
        return _sign(a), 0.0, abs(a)
    if a == 0:
        return 0.0, _sign(b), abs(b)
    if abs(b) > abs(a):
        tau = a / b
        s = _sign(b) / math.sqrt(1 + tau * tau)
        c = s * tau
        return c, s, b / s
    tau = b / a
    c = _sign(a) / math.sqrt(1 + tau * tau)
    s = c * tau
    return c, s, a / c


def lsmr(A, b, atol=1e-6, btol=1e-6, conlim=1e8, maxiter=None, x0=None):
    """The least-squares solution of ``A x = b`` (minimum norm from ``x0``); ``A`` a scipy sparse
    matrix, ``b`` a vector. Returns ``x`` (a new float64 array)."""
    m, n = A.shape
    AT = A.T.tocsr()
    maxiter = min(m, n) if maxiter is None else maxiter
    u = np.asarray(b, dtype=float)
    normb = norm(u)
    if x0 is None:
        x = np.zeros(n)
        beta = normb
    else:
        x = np.array(x0, dtype=float)
        u = u - A @ x
        beta = norm(u)
    if beta > 0:
        u = (1 / beta) * u
        v = AT @ u
        alpha = norm(v)
    else:
        v = np.zeros(n)
        alpha = 0.0
    if alpha > 0:
        v = (1 / alpha) * v
    zetabar, alphabar = alpha * beta, alpha
    rho = rhobar = cbar = 1.0
    sbar = 0.0
    h, hbar = v.copy(), np.zeros(n)
    betadd, betad, rhodold = beta, 0.0, 1.0
    tautildeold = thetatilde = zeta = d = 0.0
    normA2 = alpha * alpha
    maxrbar, minrbar = 0.0, 1e100
    ctol = 1 / conlim if conlim > 0 else 0.0
    if alpha * beta == 0:
        return x
    if normb == 0:
        return np.zeros(n)
    itn = 0
    while itn < maxiter:
        itn += 1
        u *= -alpha
        u += A @ v
        beta = norm(u)
        if beta > 0:
            u *= 1 / beta
            v *= -beta
            v += AT @ u
            alpha = norm(v)
            if alpha > 0:
                v *= 1 / alpha
        chat, shat, alphahat = _sym_ortho(alphabar, 0.0)
        rhoold = rho
        c, s, rho = _sym_ortho(alphahat, beta)
        thetanew = s * alpha
        alphabar = c * alpha
        rhobarold, zetaold = rhobar, zeta
        thetabar = sbar * rho
        rhotemp = cbar * rho
        cbar, sbar, rhobar = _sym_ortho(cbar * rho, thetanew)
        zeta = cbar * zetabar
        zetabar = -sbar * zetabar
        hbar *= -(thetabar * rho / (rhoold * rhobarold))
        hbar += h
        x += (zeta / (rho * rhobar)) * hbar
        h *= -(thetanew / rho)
        h += v
        # estimates of ||r|| and ||A||, ||x||, cond(A) for the stopping rules
        betaacute, betacheck = chat * betadd, -shat * betadd
        betahat, betadd = c * betaacute, -s * betaacute
        thetatildeold = thetatilde
        ctildeold, stildeold, rhotildeold = _sym_ortho(rhodold, thetabar)
        thetatilde = stildeold * rhobar
        rhodold = ctildeold * rhobar
        betad = -stildeold * betad + ctildeold * betahat
        tautildeold = (zetaold - thetatildeold * tautildeold) / rhotildeold
        taud = (zeta - thetatilde * tautildeold) / rhodold
        d += betacheck * betacheck
        normr = math.sqrt(d + (betad - taud) ** 2 + betadd * betadd)
        normA2 += beta * beta
        normA = math.sqrt(normA2)
        normA2 += alpha * alpha
        maxrbar = max(maxrbar, rhobarold)
        if itn > 1:
            minrbar = min(minrbar, rhobarold)
        condA = max(maxrbar, rhotemp) / min(minrbar, rhotemp)
        normar = abs(zetabar)
        normx = norm(x)
        test1 = normr / normb
        test2 = normar / (normA * normr) if normA * normr != 0 else math.inf
        test3 = 1 / condA
        t1 = test1 / (1 + normA * normx / normb)
        rtol = btol + atol * normA * normx / normb
        if (1 + test3 <= 1 or 1 + test2 <= 1 or 1 + t1 <= 1 or test3 <= ctol or test2 <= atol
                or test1 <= rtol):
            break
    return x
