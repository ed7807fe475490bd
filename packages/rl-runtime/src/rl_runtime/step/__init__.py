"""The blocks of an RL step every pipeline shares: env population, failure screening, step metrics, collation, advantages, the policy update, the supervised warm-up."""
