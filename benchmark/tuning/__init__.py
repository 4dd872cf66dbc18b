"""Tuning: Optuna studies over an algorithm's search space, trials trained as runs. Imports the
wings below it (analysis, execution, training) and the ground."""
