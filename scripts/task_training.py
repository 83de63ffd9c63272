"""The ladder's task training, for the scripts: a re-export of :mod:`tokenops.training.tasks`
(the code lives in the package so ``tokenops distill`` works from an installed wheel)."""

from tokenops.training.tasks import *  # noqa: F401,F403
from tokenops.training.tasks import _FILLER_CITIES, _FILLER_THINGS, _KEYS  # noqa: F401
