"""apps/async as a package: `spec` (command line: apps/rlvr's recipe run twice, imported from
rl_app_rlvr), `compare` (the two runs' overrides and the figures compared)."""
