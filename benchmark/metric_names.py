"""The names of the metrics every run logs, in one place: the training loops write them, the
launch, reports, regression checks and bundles read them back.

Metrics are logged at the env step they describe; ``final/*`` at the last one."""

EVAL_RETURN_MEAN = "eval/return_mean"
"""Mean undiscounted return of one deterministic evaluation (its episodes, or a meta-test's tasks after adaptation)."""
EVAL_RETURN_STD = "eval/return_std"
EVAL_LENGTH_MEAN = "eval/length_mean"
TRAIN_EPISODE_RETURN = "train/episode_return"
"""Each training episode's return, as it ends (for normalized rewards: the unnormalized one)."""
TRAIN_EPISODE_LENGTH = "train/episode_length"
TRAIN_RETURN = "train/return_since_eval"
"""Logged at each evaluation: the mean return of the training episodes that ended since the previous one."""
STEPS_PER_SECOND = "perf/steps_per_second"
"""Env steps per second of training so far (evaluation time excluded)."""
FINAL_RETURN_MEAN = "final/eval_return_mean"
"""The last evaluation's mean return, logged once the run has finished: a FINISHED run has it."""
FINAL_RETURN_STD = "final/eval_return_std"
FINAL_STEPS_PER_SECOND = "final/steps_per_second"
FINAL_WALL_SECONDS = "final/wall_seconds"
FINAL_CPU_SECONDS = "final/cpu_seconds"
"""CPU seconds (user + system) of the process that trained the run, every attempt summed: a
batch's process counts once for all its seeds; what a core-hour estimate is checked against
(wall time also counts waiting for a core another process holds)."""
FINAL_TRAIN_RETURN_LAST100 = "final/train_return_last100"
"""The mean return of the run's last 100 training episodes (CleanRL's score), with ..."""
FINAL_TRAIN_EPISODES_LAST100 = "final/train_episodes_last100"
"""... how many episodes that is (fewer than 100 when the run had fewer)."""
PRE_ADAPTATION_RETURN = "meta_test/pre_adaptation_return"
"""Meta-RL: the meta-test's mean return before adaptation (EVAL_RETURN_MEAN is after)."""
POST_ADAPTATION_RETURN = "meta_test/post_adaptation_return"
ADAPTATION_GAIN = "meta_test/adaptation_gain"

VIDEO_STRIP_TAG = "video_strip"
"""Tag of a run whose final policy was filmed (``evaluate --video``): the artifact path of the
PNG strip of that episode's frames, which the suite's report shows."""

FINGERPRINT_TAG = "behaviour_fingerprint"
"""Tag of a run: the behaviour fingerprint of the algorithm's code that trained it
(``benchmark.training.fingerprint``): runs with different fingerprints were trained by code that
behaves differently."""
