"""apps/distill as a package: `spec` (command line, compose and run), `options` (the
`distill_app:` section), `recipe` (one on-policy distillation step on rl_runtime's Runner)."""
