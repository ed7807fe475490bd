"""apps/sft as a package: `spec` (command line, compose and run), `options` (the `sft_app:`
section), `recipe` (one supervised step on rl_runtime's Runner)."""
