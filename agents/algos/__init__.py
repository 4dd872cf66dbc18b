"""One module per algorithm family (their hyperparameters: ``agents.configs``, re-exported here)."""

from agents.algos.bc import BC
from agents.algos.ddpg import DDPG, TD3
from agents.algos.dqn import DQN
from agents.algos.maml import MAML, MAMLPPO, MAMLTRPO, MAMLVPG
from agents.algos.mpo import MPO
from agents.algos.onpolicy import OnPolicyAlgorithm
from agents.algos.pearl import PEARL
from agents.algos.ppo import PPO, PPOAdaptiveKL, SurrogatePG
from agents.algos.sac import SAC
from agents.algos.trpo import TRPO
from agents.algos.vpg import A2C, REINFORCE, VPG
from agents.configs.bc import BCConfig
from agents.configs.ddpg import DDPGConfig, TD3Config
from agents.configs.dqn import DQNConfig
from agents.configs.maml import MAMLPPOConfig, MAMLTRPOConfig, MAMLVPGConfig
from agents.configs.mpo import MPOConfig
from agents.configs.onpolicy import OnPolicyConfig
from agents.configs.pearl import PEARLConfig
from agents.configs.ppo import PPOAdaptiveKLConfig, PPOConfig, SurrogateConfig
from agents.configs.sac import SACConfig
from agents.configs.trpo import TRPOConfig
from agents.configs.vpg import A2CConfig, REINFORCEConfig, VPGConfig

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
