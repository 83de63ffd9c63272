"""Training code shipped with the package (not only in a source checkout).

- :mod:`tokenops.training.chat` — the demo models' chat template (``render``, special tokens),
  the warmup+cosine learning-rate schedule and ``save_model`` (HF folder, bf16);
- :mod:`tokenops.training.tasks` — (prompt, answer) pairs from the checkable task suites,
  answer-only loss batches, ``finetune``, greedy generation and suite accuracy.

``tokenops distill train|eval`` use these; ``scripts/train_demo_models.py``,
``scripts/task_training.py`` (a re-export) and the ladder scripts import them too. Importing
this package is light: torch and transformers load with the submodules that need them.
"""
