"""A run's skeleton: the Runner, its preflight, the model source, locks, previous-run handling, resume guard, interrupts."""
