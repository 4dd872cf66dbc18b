"""reprorl benchmark: suites, the runner, MLflow tracking, reports."""
