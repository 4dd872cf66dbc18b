"""Networks and action distributions."""

from agents.nets.distributions import Categorical, DiagGaussian, TanhGaussian
from agents.nets.mlp import mlp, polyak_update
from agents.nets.policies import ActorCritic, QEnsemble, SquashedGaussianActor

__all__ = [
    "ActorCritic",
    "Categorical",
    "DiagGaussian",
    "QEnsemble",
    "SquashedGaussianActor",
    "TanhGaussian",
    "mlp",
    "polyak_update",
]
