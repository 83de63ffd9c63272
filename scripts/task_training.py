"""The ladder's task training, for the scripts: a re-export of
``tokenops_plugins.multi_model._task_training`` (the code ships in the package, next to the
suites, so ``tokenops distill`` works from an installed wheel)."""

from tokenops_plugins.multi_model._task_training import *  # noqa: F401,F403
from tokenops_plugins.multi_model._task_training import _FILLER_CITIES, _FILLER_THINGS, _KEYS  # noqa: F401
