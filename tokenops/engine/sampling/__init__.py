"""Sampling: parameters, defaults, logits processors, grammars (JSON schema, regex), thinking budgets, prompt logprobs."""
