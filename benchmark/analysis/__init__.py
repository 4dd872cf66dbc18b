"""Analysis: finished runs read back and judged: records, bundles to and from the store,
statistics, reference scores, verdicts, reports and plots, regression checks, the end-of-run
summary, reproduction, the MuJoCo record and parity records. Imports execution, training and the ground."""
