"""On-policy distillation: teachers on their own workers, the student trained toward them."""
