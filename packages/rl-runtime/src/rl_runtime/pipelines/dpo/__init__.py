"""The offline preference pipeline's parts: compose plan, preference data, the recipe's step parts, the CPU default's arithmetic data."""
