"""Training code shipped with the package (not only in a source checkout).

- :mod:`tokenops.training.chat` — the demo models' chat template (``render``, special tokens),
  the warmup+cosine learning-rate schedule and ``save_model`` (HF folder, bf16).

The task training built on the checkable suites (pairs, answer-only batches, ``finetune``,
suite accuracy) lives next to the suites, in ``tokenops_plugins.multi_model._task_training``
(core imports no private plugin module). ``tokenops distill train|eval`` use both;
``scripts/train_demo_models.py`` and ``scripts/task_training.py`` (a re-export) too. Importing
this package is light: torch and transformers load inside the functions that need them.
"""
