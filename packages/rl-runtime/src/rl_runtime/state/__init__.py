"""What a run saves to resume: checkpoints and run state."""
