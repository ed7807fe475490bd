"""apps/agentic as a package: `spec` (command line, compose and run), `options` (the
`agentic_app:` section), `recipe` (one agentic step on rl_runtime's Runner)."""
