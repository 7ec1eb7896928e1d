"""SHAP attributions of the RL policy's outputs (in action units) to its input features. Pure.

Inputs are the flattened observation: `<cluster>.<feature>` per graph node (NODE_FEATURES),
`<cluster>/<pool>.<feature>` per scalable pool (POOL_FEATURES), then `batch.<feature>`.
Outputs are named as `output_names` says: `bias[<cluster>]` and `<action>[<cluster>]` for
the cluster-scope actions, `<action>[<cluster>/<pool>]` for the pool-scope ones, then the
global ones. Decision records (`skyfed explain ID --policy`) and tests call `shap_values`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from broker.placement.policy import (
    ACTIONS,
    BATCH_FEATURES,
    NODE_FEATURES,
    POOL_FEATURES,
    ActorCritic,
    GraphObs,
    squash,
)

OUTPUT_PREFIX = {"cluster_bias_usd_per_hour": "bias"}


def feature_names(obs: GraphObs) -> list[str]:
    """Names of the flattened features SHAP explains (module docstring)."""
    return ([f"{n}.{f}" for n in obs.names for f in NODE_FEATURES]
            + [f"{c}/{p}.{f}" for c, p in obs.pools for f in POOL_FEATURES]
            + [f"batch.{f}" for f in BATCH_FEATURES])


def output_names(obs: GraphObs) -> list[str]:
    """One name per policy output, in the raw layout's order (module docstring)."""
    layout = obs.layout
    names: list[str] = [""] * layout.width
    for spec in ACTIONS:
        sl = layout.block(spec)
        prefix = OUTPUT_PREFIX.get(spec.name, spec.name)
        if spec.scope == "cluster":
            labels = [f"{prefix}[{n}]" for n in obs.names]
        elif spec.scope == "pool":
            labels = [f"{prefix}[{c}/{p}]" for c, p in obs.pools]
        else:
            labels = [spec.name]
        names[sl] = labels
    return names


def _squashed_fn(model: ActorCritic, obs: GraphObs) -> Callable[[np.ndarray], np.ndarray]:
    """f(X [rows, N*F + P*PF + B]) -> policy outputs [rows, width] in action units."""
    n, p = len(obs.names), len(obs.pools)
    nf, pf = len(NODE_FEATURES), len(POOL_FEATURES)
    edge_index = torch.as_tensor(obs.edge_index, dtype=torch.int64)
    edge_x = torch.as_tensor(obs.edge_x, dtype=torch.float32)
    pool_cluster = torch.as_tensor(obs.pool_cluster, dtype=torch.int64)
    layout = obs.layout

    def f(x: np.ndarray) -> np.ndarray:
        xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
        b = xt.shape[0]
        cut = n * nf + p * pf
        with torch.no_grad():
            mean, _, _ = model.forward_tensors(
                xt[:, : n * nf].reshape(b, n, nf), edge_index, edge_x[None].expand(b, -1, -1),
                xt[:, cut:], xt[:, n * nf:cut].reshape(b, p, pf), pool_cluster)
        return squash(layout, mean.numpy())

    return f


def _flat(o: GraphObs) -> np.ndarray:
    return np.concatenate([o.node_x.reshape(-1), o.pool_x.reshape(-1),
                           o.batch_x]).astype(np.float32)


def permutation_shapley(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray,
                        base: np.ndarray, *, permutations: int = 8,
                        seed: int = 0) -> np.ndarray:
    """Shapley values by antithetic permutation sampling (Strumbelj & Kononenko 2014).

    For each sampled feature order, features switch from `base` to `x` one at a time and each
    output's change is credited to the feature switched; reversed orders are paired to cut
    variance. Exact additivity holds per permutation: sum of values = f(x) - f(base).
    Returns [features, outputs]. All rows go through `f` in one batch.
    """
    m = x.shape[0]
    rng = np.random.default_rng(seed)
    orders = []
    for _ in range(max(1, permutations // 2)):
        p = rng.permutation(m)
        orders += [p, p[::-1]]
    rows = np.empty((len(orders) * (m + 1), m), dtype=np.float32)
    for k, order in enumerate(orders):
        cur = base.copy()
        rows[k * (m + 1)] = cur
        for j, feat in enumerate(order, start=1):
            cur[feat] = x[feat]
            rows[k * (m + 1) + j] = cur
    out = np.asarray(f(rows))
    phi = np.zeros((m, out.shape[1]))
    for k, order in enumerate(orders):
        block = out[k * (m + 1):(k + 1) * (m + 1)]
        phi[order] += np.diff(block, axis=0)
    return phi / len(orders)


def shap_values(model: ActorCritic, obs: GraphObs, background: Sequence[GraphObs],
                *, top: int = 5, backend: str = "permutation", permutations: int = 8,
                ) -> dict[str, list[tuple[str, float]]]:
    """SHAP values of each policy output (in action units) against the flattened features.

    Baseline: the mean of `background` states (which must share `obs`'s graph). Backends:
    "permutation" (default, `permutation_shapley`, torch only) and "shap" (the shap library's
    permutation explainer; needs the `explain` extra, and its first call JIT-compiles for
    ~25 s on a loaded 2-core machine). Returns, per output, its `top` features by |value|.
    """
    f = _squashed_fn(model, obs)
    base = np.stack([_flat(o) for o in background] or [_flat(obs)]).mean(axis=0)
    x = _flat(obs)
    if backend == "shap":
        import shap  # optional extra

        masker = shap.maskers.Independent(base[None])
        explainer = shap.explainers.Permutation(f, masker, seed=0)
        result = explainer(x[None], max_evals=2 * x.shape[0] + 1, silent=True)
        values = np.asarray(result.values)[0]
    elif backend == "permutation":
        values = permutation_shapley(f, x, base.astype(np.float32), permutations=permutations)
    else:
        raise ValueError(f"unknown SHAP backend {backend!r} (permutation | shap)")
    names = feature_names(obs)
    out: dict[str, list[tuple[str, float]]] = {}
    for j, oname in enumerate(output_names(obs)):
        order = np.argsort(-np.abs(values[:, j]))[:top]
        out[oname] = [(names[i], float(values[i, j])) for i in order]
    return out
