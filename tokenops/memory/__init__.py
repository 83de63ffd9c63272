"""Session memory (layer 2 in the gateway): per-session stores of past turns and the
fitting of long conversations into a model's context. See store.py and fit.py."""
