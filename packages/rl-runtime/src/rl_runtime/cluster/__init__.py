"""Workers and where they run: Ray setup, placement, worker groups, the worker classes, bounded calls, weight-sync transport."""
