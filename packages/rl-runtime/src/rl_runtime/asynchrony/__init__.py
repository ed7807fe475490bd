"""Asynchronous training: the rollout producer, the bounded queue, the staleness bound, the runner's asynchronous step."""
