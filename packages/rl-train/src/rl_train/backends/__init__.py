"""Backend implementations; import them through :func:`rl_train.build_backend`."""
