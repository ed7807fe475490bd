"""apps/dpo as a package: `spec` (command line, compose and run), `options` (the `dpo_app:`
section), `recipe` (one preference-optimisation step on rl_runtime's Runner)."""
