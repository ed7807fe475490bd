"""apps/rlvr as a package: `spec` (command line, compose and run), `options` (the `rlvr_app:`
section), `recipe` (one RLVR step on rl_runtime's Runner). apps/async runs it by import."""
