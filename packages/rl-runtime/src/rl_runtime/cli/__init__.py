"""Command lines: the one every app shares (app_main, app_options), rl-config's deep check, rl-doctor, rl-export."""
