"""A model's sensitivity carried across pruning methods: the two-way empirical-Bayes prior of a feature
law's coefficient (docs/science.md, "Pooling across methods").

Every measured curve has its own coefficient c (`core.prediction.feature_laws.fit_curve`). The intra-layer
methods share one kind of feature (the mask errors of `core.profiles.MASK_FEATURES`), so their
coefficients can be compared, and ln c is split into what the method does and how sensitive the
model is to losing that much of its linears' output energy:

    ln c[k, m] = mu[k] + u[m] + e[k, m]        k a method, m a model

Each curve is a cell (two calibrations of one pair are two cells). mu and u are fitted by least
squares over the cells a training set has. The prior of a pair nobody measured, method k on model
M, is mu[k] + u[M]: the method's level, moved by what model M showed under the other methods.
Its spread in ln c is the interaction e, whose variance tau^2 comes from the fit's residuals
pooled with `COEFFICIENT_SPREAD0` (taken as an sd in ln c, worth `PRIOR_CURVES` cells, as in the
per-method pooling), plus the error of mu[k] + u[M] itself: the prediction is a weighted sum of the
cells' ln c, and each weight's square carries one tau^2 and that cell's sampling variance.

The pooling needs the method and the model to be linked: some model measured under both method k
and a method that model M was measured under. Pure Python, like `core.prediction.feature_laws`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.prediction.feature_laws import (
    COEFFICIENT_SPREAD0,
    PRIOR_CURVES,
    Coefficient,
    CurveFit,
    pooled_sigma,
)


@dataclass(frozen=True)
class Cell:
    """One curve's coefficient, placed by its method and model."""

    method: str
    model: str
    fit: CurveFit

    @property
    def log_c(self) -> float:
        return math.log(self.fit.c)

    @property
    def log_variance(self) -> float:
        """Sampling variance of ln c (delta method: (se / c)^2)."""
        return (self.fit.se / self.fit.c) ** 2


@dataclass(frozen=True)
class Effects:
    """The additive fit: each method's level and each model's shift, in ln c."""

    method: Mapping[str, float]
    model: Mapping[str, float]

    def at(self, method: str, model: str) -> float:
        return self.method[method] + self.model[model]


class _Design:
    """The least-squares problem of (method, model) cells: one column per method (its mu) and per
    model but the first (its u; the first model's u is 0), one row per cell with a 1 in each of its
    two columns. The normal matrix is nonsingular when the cells link every method and model."""

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self.methods = sorted({k for k, _ in pairs})
        self.models = sorted({m for _, m in pairs})
        self.columns = {("method", k): i for i, k in enumerate(self.methods)}
        for m in self.models[1:]:
            self.columns[("model", m)] = len(self.columns)
        self.rows = [self.row(k, m) for k, m in pairs]
        size = len(self.columns)
        self.normal = [[0.0] * size for _ in range(size)]
        for row in self.rows:
            for i in row:
                for j in row:
                    self.normal[i][j] += 1.0

    def row(self, method: str, model: str) -> list[int]:
        """The columns a cell (or a prediction) of this pair adds up."""
        model_column = self.columns.get(("model", model))
        return [self.columns[("method", method)]] + ([] if model_column is None else [model_column])

    def solve(self, rhs: Sequence[float]) -> list[float]:
        return _solve(self.normal, rhs)


def fit_effects(cells: Sequence[tuple[str, str, float]]) -> Effects:
    """Least-squares mu and u of linked (method, model, value) cells (the models' shifts centred on
    0; predictions of linked pairs do not depend on where they are centred)."""
    design = _Design([(k, m) for k, m, _ in cells])
    rhs = [0.0] * len(design.columns)
    for row, (_, _, value) in zip(design.rows, cells, strict=True):
        for i in row:
            rhs[i] += value
    solution = design.solve(rhs)
    u = {
        m: 0.0 if ("model", m) not in design.columns else solution[design.columns[("model", m)]]
        for m in design.models
    }
    centre = _mean(list(u.values()))
    return Effects(
        {k: solution[design.columns[("method", k)]] + centre for k in design.methods},
        {m: value - centre for m, value in u.items()},
    )


def prediction_weights(pairs: Sequence[tuple[str, str]], method: str, model: str) -> list[float]:
    """How much each cell's value counts in the fitted mu[method] + u[model]: the fit is linear in
    the values, w = X (X^T X)^-1 x for the pair's design row x."""
    design = _Design(pairs)
    target = [0.0] * len(design.columns)
    for i in design.row(method, model):
        target[i] = 1.0
    z = design.solve(target)
    return [math.fsum(z[i] for i in row) for row in design.rows]


def _solve(matrix: Sequence[Sequence[float]], rhs: Sequence[float]) -> list[float]:
    """x with matrix x = rhs, by Gaussian elimination with partial pivoting (a few dozen unknowns)."""
    n = len(rhs)
    a = [[*row, rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            raise ValueError("the cells do not link every method and model")
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            factor = a[r][col] / a[col][col]
            if factor:
                for c in range(col, n + 1):
                    a[r][c] -= factor * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - math.fsum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


def linked_cells(cells: Sequence[Cell], method: str, model: str) -> list[Cell]:
    """The cells of the method's component of the method-model graph (each cell an edge) when the
    model is in it too; empty when no chain of cells links the two."""
    methods: set[str] = {method}
    models: set[str] = set()
    grew = True
    while grew:
        grew = False
        for cell in cells:
            if (cell.method in methods) != (cell.model in models):
                methods.add(cell.method)
                models.add(cell.model)
                grew = True
    return [cell for cell in cells if cell.method in methods] if model in models else []


def two_way_prior(cells: Sequence[Cell], method: str, model: str, source: str) -> Coefficient | None:
    """The empirical-Bayes prior of c for `method` on `model` from cells of other pairs (see the
    module docstring), or None when the two are not linked by the cells (cells with c <= 0 have no
    logarithm and are left out)."""
    positive = [
        cell for cell in cells if cell.fit.c > 0.0 and not (cell.method == method and cell.model == model)
    ]
    component = linked_cells(positive, method, model)
    if not component:
        return None
    values = [(cell.method, cell.model, cell.log_c) for cell in component]
    effects = fit_effects(values)
    centre = effects.at(method, model)
    residual_sq = math.fsum((value - effects.at(k, m)) ** 2 for k, m, value in values)
    parameters = len(effects.method) + len(effects.model) - 1
    dof = len(values) - parameters
    sampling = _mean([cell.log_variance for cell in component])
    observed = max(residual_sq / dof - sampling, 0.0) if dof > 0 else 0.0
    tau_sq = (PRIOR_CURVES * COEFFICIENT_SPREAD0**2 + dof * observed) / (PRIOR_CURVES + dof)
    weights = prediction_weights([(k, m) for k, m, _ in values], method, model)
    variance = tau_sq * (1.0 + math.fsum(w * w for w in weights)) + math.fsum(
        w * w * cell.log_variance for w, cell in zip(weights, component, strict=True)
    )
    value = math.exp(centre)
    sigma = pooled_sigma(
        math.fsum(cell.fit.residual_sq for cell in component), sum(cell.fit.dof for cell in component)
    )
    return Coefficient(value, value * math.sqrt(variance), sigma, source, curves=len(component))


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0
