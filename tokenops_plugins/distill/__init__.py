"""The distillation loop (layer 2): capture an expensive model's answers for opted-in
tenants, export them, train a bundled student on them and evaluate it."""
