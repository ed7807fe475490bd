"""The agentic pipeline's parts: multi-turn episodes, solver demonstrations, success-rate gains."""
