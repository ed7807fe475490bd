"""What a run reports: experiment tracking, timing, curves, summary.json."""
