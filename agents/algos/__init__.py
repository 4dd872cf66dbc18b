"""One module per algorithm family."""

from agents.algos.bc import BC, BCConfig
from agents.algos.ddpg import DDPG, TD3, DDPGConfig, TD3Config
from agents.algos.dqn import DQN, DQNConfig
from agents.algos.maml import MAML, MAMLPPO, MAMLTRPO, MAMLVPG, MAMLPPOConfig, MAMLTRPOConfig, MAMLVPGConfig
from agents.algos.mpo import MPO, MPOConfig
from agents.algos.onpolicy import OnPolicyAlgorithm, OnPolicyConfig
from agents.algos.pearl import PEARL, PEARLConfig
from agents.algos.ppo import PPO, PPOAdaptiveKL, PPOAdaptiveKLConfig, PPOConfig, SurrogateConfig, SurrogatePG
from agents.algos.sac import SAC, SACConfig
from agents.algos.trpo import TRPO, TRPOConfig
from agents.algos.vpg import A2C, REINFORCE, VPG, A2CConfig, REINFORCEConfig, VPGConfig

__all__ = [
    "A2C",
    "A2CConfig",
    "BC",
    "BCConfig",
    "DDPG",
    "DDPGConfig",
    "DQN",
    "DQNConfig",
    "MAML",
    "MAMLPPO",
    "MAMLPPOConfig",
    "MAMLTRPO",
    "MAMLTRPOConfig",
    "MAMLVPG",
    "MAMLVPGConfig",
    "MPO",
    "MPOConfig",
    "OnPolicyAlgorithm",
    "OnPolicyConfig",
    "PEARL",
    "PEARLConfig",
    "PPO",
    "PPOAdaptiveKL",
    "PPOAdaptiveKLConfig",
    "PPOConfig",
    "REINFORCE",
    "REINFORCEConfig",
    "SAC",
    "SACConfig",
    "SurrogateConfig",
    "SurrogatePG",
    "TD3",
    "TD3Config",
    "TRPO",
    "TRPOConfig",
    "VPG",
    "VPGConfig",
]
