"""One module per algorithm family."""

from agents.algos.ddpg import DDPG, TD3, DDPGConfig, TD3Config
from agents.algos.dqn import DQN, DQNConfig
from agents.algos.mpo import MPO, MPOConfig
from agents.algos.ppo import PPO, PPOConfig
from agents.algos.sac import SAC, SACConfig

__all__ = ["DDPG", "DDPGConfig", "DQN", "DQNConfig", "MPO", "MPOConfig", "PPO", "PPOConfig", "SAC", "SACConfig", "TD3", "TD3Config"]
