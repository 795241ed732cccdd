"""Compute-performance fit per config: ScaleRL's sigmoid in training compute.

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

C is model FLOPs used (``flops_total``, mean over seeds at a rung), R the mean accuracy over
seeds (a fraction). A is the asymptote, R0 the accuracy at no RL compute, C_mid the compute at
the midpoint between them, B the steepness per e-fold of compute. Conventions:

- The fit is least squares in log-C space: x = ln C, R = R0 + (A - R0) * logistic(B (x - ln C_mid))
  (unweighted: every rung counts the same), by ``scipy.optimize.curve_fit`` (trust-region
  reflective, bounded) from a few fixed starting points, keeping the lowest residual.
- Bounds: B in [1e-3, 50]; ln C_mid within two decades of the observed compute range; A and R0
  in [0, 1] when every observed value lies in [0, 1] (an accuracy), unbounded otherwise.
- R0 is fixed to the base policy's accuracy when one is known: given explicitly, or read from
  rows with ``flops_total`` == 0 (the base policy evaluated before any RL step; all rewards and
  allocations of a size share it). Otherwise R0 is a free parameter.
- Free parameters: 3 (A, B, C_mid) with R0 fixed, else 4. With fewer rungs than that, the
  status is "insufficient rungs" and no parameter is reported: an under-determined fit would
  be a curve through the points, not an estimate.
- Held-out check: refit on every rung but the largest and predict the largest;
  ``holdout_error_points`` = 100 x (prediction - observation). It needs one rung more than the
  fit itself, else ``holdout_status`` is "insufficient rungs".
- Uncertainty band (:func:`sigmoid_band`, :func:`band_table`; drawn by the figures): a
  pointwise 95% band of the fitted curve from the rungs' own evaluation uncertainty, by
  parametric bootstrap (:data:`BAND_REPS` = 200 replicates, seeded: deterministic). Each
  replicate redraws every rung's mean accuracy from N(acc, se^2) (se: the seed-combined
  standard error of :func:`race.analysis.frontier.seed_summary`; clipped to [0, 1] for an
  accuracy), refits the sigmoid (same bounds, R0 held at the base accuracy when fixed, started
  from the fit) and evaluates it; the band is the 2.5% and 97.5% percentiles of the replicate
  curves at each C. It spans only the observed compute range (smallest to largest FLOPs with
  data): the figures do not extrapolate. It is conditional on the sigmoid's form and on R0: it
  shows how far the rungs' noise moves the curve, not whether the form is right.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import OptimizeWarning, curve_fit

from race.analysis.frontier import pooled, seed_summary, targets_in
from race.analysis.parallel import pmap

B_BOUNDS = (1e-3, 50.0)
#: How far outside the observed compute range C_mid may go (natural log: two decades).
MID_MARGIN = math.log(100.0)

INSUFFICIENT = "insufficient rungs"
FAILED = "fit failed"


def sigmoid(flops: np.ndarray | float, A: float, B: float, C_mid: float, R0: float) -> np.ndarray:
    """R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), C in FLOPs (> 0)."""
    x = np.log(np.asarray(flops, dtype=float))
    return _logistic(x, A, B, math.log(C_mid), R0)


def _logistic(x: np.ndarray, A: float, B: float, m: float, R0: float) -> np.ndarray:
    # (C_mid / C)^B = exp(B (m - x)); written as a logistic it cannot overflow.
    return R0 + (A - R0) * 0.5 * (1.0 + np.tanh(0.5 * B * (x - m)))


def _problem(x: np.ndarray, r: np.ndarray, r0: float | None) -> tuple[object, list, list]:
    """The model of ln C and its parameter bounds (module docstring): (model, lower, upper)."""
    values = r if r0 is None else np.append(r, r0)
    bounded = bool(np.all((values >= 0) & (values <= 1)))
    lo_v, hi_v = (0.0, 1.0) if bounded else (-np.inf, np.inf)
    m_lo, m_hi = x.min() - MID_MARGIN, x.max() + MID_MARGIN
    lower = [lo_v, B_BOUNDS[0], m_lo] + ([] if r0 is not None else [lo_v])
    upper = [hi_v, B_BOUNDS[1], m_hi] + ([] if r0 is not None else [hi_v])
    if r0 is None:
        return _logistic, lower, upper

    def model(xx: np.ndarray, A: float, B: float, m: float) -> np.ndarray:
        return _logistic(xx, A, B, m, float(r0))
    return model, lower, upper


@dataclass(frozen=True)
class SigmoidFit:
    """One fit. ``status`` is "ok", "insufficient rungs" or "fit failed" (then params are NaN)."""

    status: str
    A: float
    B: float
    C_mid: float
    R0: float
    r0_fixed: bool
    n_points: int
    n_free: int
    rmse: float  # in-sample root mean square residual (fraction)

    def predict(self, flops: np.ndarray | float) -> np.ndarray:
        return sigmoid(flops, self.A, self.B, self.C_mid, self.R0)


def fit_sigmoid(flops: np.ndarray, acc: np.ndarray, r0: float | None = None) -> SigmoidFit:
    """Fit R(C) to points (FLOPs > 0, accuracy); R0 fixed to ``r0`` when given."""
    c = np.asarray(flops, dtype=float)
    r = np.asarray(acc, dtype=float)
    keep = np.isfinite(c) & np.isfinite(r) & (c > 0)
    c, r = c[keep], r[keep]
    fixed = r0 is not None and math.isfinite(r0)
    n_free = 3 if fixed else 4
    nan = math.nan

    def result(status: str, p: tuple[float, float, float, float] = (nan,) * 4,
               rmse: float = nan) -> SigmoidFit:
        return SigmoidFit(status, p[0], p[1], p[2], p[3], bool(fixed), int(len(c)), n_free,
                          rmse)

    if len(np.unique(c)) < n_free:
        return result(INSUFFICIENT)
    x = np.log(c)
    model, lower, upper = _problem(x, r, r0 if fixed else None)
    lo_v, hi_v = lower[0], upper[0]
    a0 = float(np.clip(r.max(), lo_v, hi_v))
    starts = []
    for q in (0.25, 0.5, 0.75):
        for b0 in (0.5, 2.0):
            p0 = [a0, b0, float(np.quantile(x, q))]
            if not fixed:
                p0.append(float(np.clip(r.min(), lo_v, hi_v)))
            starts.append(p0)
    best: tuple[float, np.ndarray] | None = None
    for p0 in starts:
        try:
            with warnings.catch_warnings():
                # An exactly determined fit has no covariance estimate: we do not use it.
                warnings.simplefilter("ignore", OptimizeWarning)
                p, _ = curve_fit(model, x, r, p0=p0, bounds=(lower, upper), maxfev=5000)
        except (RuntimeError, ValueError):
            continue
        sse = float(np.sum((model(x, *p) - r) ** 2))
        if best is None or sse < best[0] - 1e-15:
            best = (sse, p)
    if best is None:
        return result(FAILED)
    sse, p = best
    A, B, m = (float(v) for v in p[:3])
    R0 = float(r0) if fixed else float(p[3])
    return result("ok", (A, B, math.exp(m), R0), math.sqrt(sse / len(r)))


#: The parametric bootstrap behind a fit's band (module docstring): replicates, seed, and the
#: points of each drawn curve.
BAND_REPS = 200
BAND_SEED = 0
BAND_POINTS = 100


def _batch_curves(x: np.ndarray, P: np.ndarray,
                  r0: float | None) -> tuple[np.ndarray, np.ndarray]:
    """R at ln C ``x`` for every parameter row of ``P`` (A, B, ln C_mid[, R0]) and its
    Jacobian: shapes (rows, len(x)) and (rows, len(x), params)."""
    A, B, m = P[:, 0:1], P[:, 1:2], P[:, 2:3]
    R0 = float(r0) if r0 is not None else P[:, 3:4]
    s = 0.5 * (1.0 + np.tanh(0.5 * B * (x - m)))
    ds = (A - R0) * s * (1.0 - s)
    cols = [s, ds * (x - m), -ds * B] + ([] if r0 is not None else [1.0 - s])
    return R0 + (A - R0) * s, np.stack(cols, axis=-1)


def _refit_batch(x: np.ndarray, Y: np.ndarray, p0: np.ndarray, lower: list, upper: list,
                 r0: float | None, iters: int = 300) -> np.ndarray:
    """Least-squares refits of the sigmoid to every row of ``Y``, all at once, from ``p0``:
    Levenberg-Marquardt (Marquardt's diagonal scaling) with each step clipped into the bounds
    and kept only when it lowers that row's residual sum of squares. One ``curve_fit`` per row
    took ~15x the time on the default study (minutes for its 192 fits); there, the residuals
    reached match those of ``curve_fit`` from the same start (within 0.2%, often lower).
    Returns the parameter rows."""
    lo, hi = np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)
    P = np.tile(np.asarray(p0, dtype=float), (len(Y), 1))
    lam = np.full(len(Y), 1e-3)
    f, J = _batch_curves(x, P, r0)
    res = f - Y
    sse = np.sum(res**2, axis=-1)
    eye = np.eye(P.shape[1])
    idle = 0
    for _ in range(iters):
        H = np.einsum("rni,rnj->rij", J, J)
        g = np.einsum("rni,rn->ri", J, res)
        D = np.einsum("rii->ri", H)
        D = D + 1e-9 * D.max(axis=-1, keepdims=True) + 1e-30  # a flat direction stays solvable
        step = np.linalg.solve(H + lam[:, None, None] * (D[:, :, None] * eye), -g[..., None])
        P_new = np.clip(P + step[..., 0], lo, hi)
        f_new, J_new = _batch_curves(x, P_new, r0)
        res_new = f_new - Y
        sse_new = np.sum(res_new**2, axis=-1)
        ok = sse_new < sse
        idle = 0 if np.any(ok & (sse - sse_new > 1e-12 * sse)) else idle + 1
        P[ok], J[ok], res[ok], sse[ok] = P_new[ok], J_new[ok], res_new[ok], sse_new[ok]
        lam = np.clip(np.where(ok, lam / 3.0, lam * 4.0), 1e-12, 1e12)
        if idle > 25:  # no row has improved for a while: converged
            break
    return P


def sigmoid_band(flops: np.ndarray, acc: np.ndarray, se: np.ndarray, fit: SigmoidFit,
                 grid: np.ndarray, reps: int = BAND_REPS,
                 seed: int = BAND_SEED) -> tuple[np.ndarray, np.ndarray] | None:
    """Pointwise 95% band ``(lo, hi)`` of the fitted R(C) at ``grid`` (FLOPs), by parametric
    bootstrap over the points (module docstring): each of ``reps`` replicates redraws ``acc``
    from N(acc, se^2), clipped to [0, 1] for an accuracy, and refits (:func:`_refit_batch`,
    the fit's bounds, R0 held when fixed); ``numpy.random.default_rng(seed)``: deterministic.

    None when there is no band: ``fit`` is not "ok", or a point has no finite ``se``.
    """
    if fit.status != "ok":
        return None
    c, r, e = (np.asarray(v, dtype=float) for v in (flops, acc, se))
    keep = np.isfinite(c) & np.isfinite(r) & (c > 0)
    c, r, e = c[keep], r[keep], e[keep]
    if not len(c) or not np.all(np.isfinite(e) & (e >= 0)):
        return None
    x = np.log(c)
    r0 = fit.R0 if fit.r0_fixed else None
    _, lower, upper = _problem(x, r, r0)
    p_hat = np.clip([fit.A, fit.B, math.log(fit.C_mid)] + ([] if r0 is not None else [fit.R0]),
                    lower, upper)
    z = np.random.default_rng(seed).standard_normal((reps, len(r)))
    Y = np.clip(r + e * z, lower[0], upper[0])
    P = _refit_batch(x, Y, p_hat, lower, upper, r0)
    curves, _ = _batch_curves(np.log(np.asarray(grid, dtype=float)), P, r0)
    lo, hi = np.percentile(curves, [2.5, 97.5], axis=0)
    return lo, hi


FIT_COLUMNS = [
    "size", "reward", "alloc", "target", "status", "n_rungs", "n_free", "r0_fixed", "A", "B",
    "C_mid", "R0", "rmse", "holdout_budget", "holdout_flops", "holdout_acc", "holdout_pred",
    "holdout_error_points", "holdout_status",
]


def base_accuracy(df: pd.DataFrame, targets: list[str]) -> dict[tuple[str, str, str], float]:
    """(size, reward, target) -> the base policy's value, from rows with ``flops_total`` == 0.

    Per reward: a base policy's ``native_reward`` is measured under one reward system only
    (race.analysis.aggregate blanks it for the others), so another reward's fit must not take
    it as its R0; a reward without a base value fits R0 freely."""
    base = df[df["flops_total"] == 0]
    out: dict[tuple[str, str, str], float] = {}
    for t in targets:
        for (size, reward), v in base.groupby(["size", "reward"])[f"acc_{t}"].mean().items():
            if math.isfinite(v):
                out[(str(size), str(reward), t)] = float(v)
    return out


def rung_points(df: pd.DataFrame, targets: list[str]) -> pd.DataFrame:
    """Per config, target and rung: mean FLOPs used and mean accuracy over seeds (pooled stages)."""
    pool = pooled(df)
    pool = pool[pool["flops_total"] > 0]
    parts = []
    for t in targets:
        s = seed_summary(pool, t, ["size", "reward", "alloc", "budget"])
        s.insert(3, "target", t)
        parts.append(s)
    return pd.concat(parts, ignore_index=True)


def _fit_row(item: tuple[tuple[str, str, str, str], pd.DataFrame, float | None]) -> dict:
    """One :func:`fit_table` row: the fit of one config's rungs and its held-out check."""
    (size, reward, alloc, target), g, r0 = item
    full = fit_sigmoid(g["flops"].to_numpy(), g["acc"].to_numpy(), r0)
    row: dict[str, object] = {
        "size": size, "reward": reward, "alloc": alloc, "target": target,
        "status": full.status, "n_rungs": int(len(g)), "n_free": full.n_free,
        "r0_fixed": full.r0_fixed, "A": full.A, "B": full.B, "C_mid": full.C_mid,
        "R0": full.R0, "rmse": full.rmse,
    }
    if not len(g):
        row["holdout_status"] = INSUFFICIENT
        return row
    last = g.iloc[-1]
    held = fit_sigmoid(g["flops"].to_numpy()[:-1], g["acc"].to_numpy()[:-1], r0)
    pred = float(held.predict(last["flops"])) if held.status == "ok" else math.nan
    row.update({
        "holdout_budget": float(last["budget"]), "holdout_flops": float(last["flops"]),
        "holdout_acc": float(last["acc"]), "holdout_pred": pred,
        "holdout_error_points": 100.0 * (pred - float(last["acc"])),
        "holdout_status": held.status,
    })
    return row


def fit_table(df: pd.DataFrame, targets: list[str] | None = None,
              base_acc: dict[tuple[str, str, str], float] | None = None,
              workers: int = 1) -> pd.DataFrame:
    """One fit per (size, reward, alloc, target): columns :data:`FIT_COLUMNS`.

    ``base_acc`` maps (size, reward, target) to the base value that fixes R0; by default it is read
    from ``flops_total`` == 0 rows (:func:`base_accuracy`), and R0 is free where there are none.
    ``workers``: processes for the fits (:func:`race.analysis.parallel.pmap`; same table).
    """
    targets = targets_in(df, targets)
    base = base_accuracy(df, targets) if base_acc is None else base_acc
    points = rung_points(df, targets)
    items = []
    for key, g in points.groupby(["size", "reward", "alloc", "target"], sort=True):
        r0 = base.get((key[0], key[1], key[3]))
        items.append((key, g[g["acc"].notna()].sort_values("budget"), r0))
    out = pd.DataFrame(pmap(_fit_row, items, workers), columns=FIT_COLUMNS)
    order = {t: i for i, t in enumerate(targets)}
    return (out.assign(_t=out["target"].map(order))
            .sort_values(["reward", "_t", "size", "alloc"], kind="mergesort")
            .drop(columns="_t").reset_index(drop=True))


BAND_COLUMNS = ["size", "reward", "alloc", "target", "flops", "fit", "lo", "hi"]


_BAND_KEYS = ["size", "reward", "alloc", "target"]


def _band_part(item: tuple[dict, pd.DataFrame, int, int, int]) -> pd.DataFrame:
    """One fit's drawn curve and band (a :func:`band_table` part)."""
    row, g, n_points, reps, seed = item
    fit = SigmoidFit(row["status"], row["A"], row["B"], row["C_mid"], row["R0"],
                     bool(row["r0_fixed"]), int(row["n_rungs"]), int(row["n_free"]), row["rmse"])
    grid = np.geomspace(g["flops"].min(), g["flops"].max(), n_points)
    band = sigmoid_band(g["flops"], g["acc"], g["se"], fit, grid, reps, seed)
    lo, hi = band if band is not None else (np.full(n_points, np.nan),) * 2
    return pd.DataFrame({**{k: row[k] for k in _BAND_KEYS}, "flops": grid,
                         "fit": fit.predict(grid), "lo": lo, "hi": hi})


def band_table(points: pd.DataFrame, fits: pd.DataFrame, n_points: int = BAND_POINTS,
               reps: int = BAND_REPS, seed: int = BAND_SEED, workers: int = 1) -> pd.DataFrame:
    """The curve and band the figures draw for every "ok" fit: columns :data:`BAND_COLUMNS`.

    Per (size, reward, alloc, target): ``n_points`` FLOPs log-spaced from the smallest to the
    largest FLOPs used among its rungs with an accuracy (never beyond them), the fitted R(C)
    (``fit``) and the 95% band (``lo``, ``hi``; NaN where :func:`sigmoid_band` gives none).
    ``points`` and ``fits`` are :func:`rung_points` and :func:`fit_table`; ``workers`` as
    there.
    """
    ok = fits[fits["status"] == "ok"]
    if ok.empty or points.empty:
        return pd.DataFrame(columns=BAND_COLUMNS)
    groups = dict(iter(points[points["acc"].notna()].groupby(_BAND_KEYS, sort=False)))
    items = []
    for row in ok.to_dict("records"):
        g = groups.get(tuple(row[k] for k in _BAND_KEYS))
        if g is not None:
            items.append((row, g, n_points, reps, seed))
    parts = pmap(_band_part, items, workers)
    if not parts:
        return pd.DataFrame(columns=BAND_COLUMNS)
    return pd.concat(parts, ignore_index=True)[BAND_COLUMNS]
