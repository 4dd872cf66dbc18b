"""One module per algorithm family."""

from agents.algos.ppo import PPO, PPOConfig
from agents.algos.sac import SAC, SACConfig

__all__ = ["PPO", "PPOConfig", "SAC", "SACConfig"]
