"""Networks and action distributions."""

from agents.nets.distributions import Categorical, DiagGaussian, TanhGaussian
from agents.nets.mlp import mlp, polyak_update
from agents.nets.offpolicy import (
    CategoricalActor,
    ContinuousQ,
    Critics,
    DeterministicActor,
    DiscreteQ,
    GaussianActor,
    NetworkShape,
    SquashedGaussianActor,
    make_critics,
)
from agents.nets.policies import ActorCritic
from agents.nets.recurrent import RecurrentEncoder

__all__ = [
    "ActorCritic",
    "Categorical",
    "CategoricalActor",
    "ContinuousQ",
    "Critics",
    "DeterministicActor",
    "DiagGaussian",
    "DiscreteQ",
    "GaussianActor",
    "NetworkShape",
    "RecurrentEncoder",
    "SquashedGaussianActor",
    "TanhGaussian",
    "make_critics",
    "mlp",
    "polyak_update",
]
