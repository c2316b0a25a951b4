"""A calibrated prior for models known only by their cards: the known models' logged value per task group,
regressed on their card fields, with its error measured by leaving one model out.

Why a prior beside the RVE: the validated choice compares models on their logged level (each model's mean return as
a fixed model on a group's training tasks, `deploy.family_floors`); a model that was never logged has no level, and
the router's own score for it is on Q_route's scale, not the logs'. So a new model either never wins (it sat below
every logged model: 0.2% of first choices on the large MINT pool's leave-models-out draws) or wins on a guess. The
prior gives it a level from what its card says (prices, context, capability flags, open weights, size, model family,
provider, description), and an error bar from how well the same regression predicts each known model it did not see.
The new model is then chosen in a group only where its prediction minus that error beats the group's best known
model: where the cards say clearly that it should win.

Pure numpy; every transform (imputation, scaling, the description's principal directions, the ridge penalty) is
fitted on the models a prediction does not concern, so a model's own logs never shape its prediction.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from rivet_jax.data.model_pool import ModelCard

__all__ = ["FIELDS", "CardPrior", "field_columns", "fit_card_prior", "fit_return_prior", "field_errors", "prior_floor"]

# The card fields the prior may read, each a block of design columns (`field_columns`).
FIELDS = ("prices", "context", "capabilities", "open_weights", "size", "family", "provider", "description")
RIDGES = (0.1, 1.0, 10.0, 100.0)   # on standardised columns; the one with the least leave-one-out error is used
DESCRIPTION_COMPONENTS = 3        # principal directions of the fitting models' description embeddings


def _log10(value: float | None, floor: float) -> float:
    return math.nan if value is None else math.log10(max(value, floor))


def _one_hot(values: Sequence[str | None]) -> np.ndarray:
    levels = sorted({v for v in values if v is not None})
    return np.array([[float(v == level) if v is not None else math.nan for level in levels] for v in values])


def field_columns(cards: Sequence[ModelCard], field: str, embeddings: np.ndarray | None = None) -> np.ndarray:
    """(M, k) one field's raw columns, NaN where a card does not say (imputed at fit time from the fitting models).
    `embeddings` (M, D): the cards' description embeddings, for "description"."""
    if field == "prices":
        return np.array([[_log10(c.price_in_per_mtok, 1e-4), _log10(c.price_out_per_mtok, 1e-4)] for c in cards])
    if field == "context":
        return np.array([[_log10(c.context_length, 1.0)] for c in cards])
    if field == "capabilities":
        flags = sorted({flag for c in cards for flag, _ in c.capabilities})
        return np.array([[math.nan if c.capability(f) is None else float(c.capability(f)) for f in flags]
                         for c in cards]).reshape(len(cards), len(flags))
    if field == "open_weights":
        return np.array([[math.nan if c.open_weights is None else float(c.open_weights)] for c in cards])
    if field == "size":
        return np.array([[_log10(c.parameters_b, 1e-3)] for c in cards])
    if field in ("family", "provider"):
        return _one_hot([getattr(c, field) for c in cards]).reshape(len(cards), -1)
    if field == "description":
        if embeddings is None:
            raise ValueError("the description field needs the cards' description embeddings")
        return np.asarray(embeddings, np.float64)
    raise ValueError(f"unknown card field {field!r}; the prior reads {', '.join(FIELDS)}")


def _design(blocks: Sequence[tuple[str, np.ndarray]], fit: np.ndarray) -> np.ndarray:
    """(M, F) standardised columns from raw blocks, every statistic taken over the rows `fit` (bool (M,)) alone: a
    missing value is the fitting models' mean (0 after standardising), a column constant over them is dropped, and
    the description keeps its top principal directions over them."""
    columns = []
    for field, raw in blocks:
        raw = np.asarray(raw, np.float64)
        if raw.shape[1] == 0:
            continue
        known = np.isfinite(raw) & fit[:, None]
        mean = np.where(known, raw, 0.0).sum(axis=0) / np.maximum(known.sum(axis=0), 1)
        x = np.where(np.isfinite(raw), raw, mean) - mean
        if field == "description":
            _, _, directions = np.linalg.svd(x[fit], full_matrices=False)
            x = x @ directions[:DESCRIPTION_COMPONENTS].T
        scale = x[fit].std(axis=0)
        keep = scale > 1e-9
        columns.append(x[:, keep] / scale[keep])
    return np.concatenate(columns, axis=1) if columns else np.zeros((len(fit), 0))


def _ridge_predict(x: np.ndarray, y: np.ndarray, fit: np.ndarray, ridges: Sequence[float]) -> np.ndarray:
    """(M,) predictions of a ridge regression of y on x (with an unpenalised intercept) fitted on the rows `fit`,
    its penalty the one of `ridges` with the least leave-one-out squared error over those rows (closed form)."""
    xf, yf = x[fit], y[fit]
    mean_x, mean_y = xf.mean(axis=0), yf.mean()
    xc, yc = xf - mean_x, yf - mean_y
    best, best_error = None, math.inf
    for ridge in ridges:
        inverse = np.linalg.inv(xc.T @ xc + ridge * np.eye(x.shape[1]))
        coef = inverse @ xc.T @ yc
        # leave-one-out residuals r_i / (1 - h_ii), h including the intercept's 1/n
        leverage = np.einsum("nf,fg,ng->n", xc, inverse, xc) + 1.0 / len(yf)
        error = float(np.mean(np.square((yc - xc @ coef) / np.maximum(1.0 - leverage, 1e-6))))
        if error < best_error:
            best, best_error = coef, error
    return mean_y + (x - mean_x) @ best


@dataclasses.dataclass(frozen=True)
class CardPrior:
    """Each pool model's predicted value per group from its card, and the prediction's error.

    prediction (M, G): for a model with logs in a group, its leave-one-model-out prediction (fitted on the other
      known models); for one without, the prediction from all the known models.
    error (G,): the root mean squared error of the leave-one-model-out predictions over the known models (NaN where
      fewer than three models are known: nothing to measure it on).
    """

    groups: tuple[str, ...]
    fields: tuple[str, ...]
    prediction: np.ndarray  # (M, G)
    error: np.ndarray       # (G,)


def fit_card_prior(cards: Sequence[ModelCard], values: np.ndarray, groups: Sequence[str],
                   fields: Sequence[str] = FIELDS, embeddings: np.ndarray | None = None,
                   ridges: Sequence[float] = RIDGES) -> CardPrior:
    """The prior of `cards` from `values` (M, G): each model's mean logged return as a fixed model on each group's
    training tasks, NaN where it has none (a new model; or not available on the group). With no embeddings the
    description field is left out."""
    values = np.asarray(values, np.float64)
    if values.shape != (len(cards), len(groups)):
        raise ValueError(f"values must be (models, groups) = ({len(cards)}, {len(groups)}), got {values.shape}")
    fields = tuple(f for f in fields if f != "description" or embeddings is not None)
    blocks = [(f, field_columns(cards, f, embeddings)) for f in fields]
    prediction = np.full(values.shape, np.nan)
    for g in range(len(groups)):
        known = np.isfinite(values[:, g])
        if known.sum() < 3:
            continue
        # every model without logs here is predicted by the one fit on all the known models
        prediction[~known, g] = _ridge_predict(_design(blocks, known), values[:, g], known, ridges)[~known]
        for m in np.flatnonzero(known):
            fit = known.copy()
            fit[m] = False
            prediction[m, g] = _ridge_predict(_design(blocks, fit), values[:, g], fit, ridges)[m]
    return CardPrior(tuple(groups), fields, prediction, _loo_error(prediction, values))


def _loo_error(prediction: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(G,) root mean squared error of the leave-one-model-out `prediction` (M, G) over the models with `values`;
    NaN in a group with fewer than three of them."""
    known = np.isfinite(values)
    squared = np.where(known, np.square(prediction - np.where(known, values, 0.0)), 0.0)
    count = known.sum(axis=0)
    return np.where(count >= 3, np.sqrt(squared.sum(axis=0) / np.maximum(count, 1)), np.nan)


def fit_return_prior(cards: Sequence[ModelCard], success: np.ndarray, cost: np.ndarray, groups: Sequence[str],
                     fields: Sequence[str] = FIELDS, embeddings: np.ndarray | None = None) -> CardPrior:
    """The prior of J = success - cost per group, each part predicted where the card says most about it: the
    success part (M, G) (J at lambda 0) regressed on `fields`, the cost part (M, G) (lambda x the discounted cost
    over c_ref: success - J) on the prices alone, in logs (a call's cost is its tokens times its prices; across a
    pool the prices span three orders of magnitude, so one expensive model would otherwise dominate a regression of
    J itself: on the large MINT pool at lambda 0.05 gpt-4's J is -3.7 against 0.0-0.9 for the others, and a
    regression of J on every field missed by 0.53 J against 0.21 for the parts). Its error is the leave-one-model-out
    root mean squared error of the J so predicted."""
    success, cost = np.asarray(success, np.float64), np.asarray(cost, np.float64)
    known = np.isfinite(success) & np.isfinite(cost)
    parts = fit_card_prior(cards, success, groups, fields, embeddings)
    if np.all(np.where(known, cost, 0.0) <= 0.0):   # lambda 0: nothing to predict
        cost_part = np.zeros_like(cost)
    else:
        cost_part = np.exp(fit_card_prior(cards, np.log(np.maximum(cost, COST_FLOOR)), groups, ("prices",)).prediction)
    prediction = parts.prediction - cost_part
    return CardPrior(parts.groups, parts.fields, prediction, _loo_error(prediction, np.where(known, success - cost,
                                                                                             np.nan)))


COST_FLOOR = 1e-4   # J: a cost part this small (a free model) is taken as this, so its log stays finite


def field_errors(cards: Sequence[ModelCard], success: np.ndarray, cost: np.ndarray, groups: Sequence[str],
                 embeddings: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """{field: (G,) the return prior's leave-one-model-out error with the success part regressed on that field
    alone} (the cost part always on the prices), with "none" (the success part the other models' mean: what a field
    adds is measured against it) and "all" (every field)."""
    fields = [f for f in FIELDS if f != "description" or embeddings is not None]
    out = {"none": fit_return_prior(cards, success, cost, groups, (), embeddings).error}
    for field in fields:
        out[field] = fit_return_prior(cards, success, cost, groups, (field,), embeddings).error
    out["all"] = fit_return_prior(cards, success, cost, groups, fields, embeddings).error
    return out


def prior_floor(prior: CardPrior, group: str) -> np.ndarray:
    """(M,) each model's conservative level in `group` from its card: prediction - error (NaN where the prior has
    none). A model with no logs is chosen on its card alone only where this beats every logged model's level."""
    g = prior.groups.index(group)
    return prior.prediction[:, g] - prior.error[g]
