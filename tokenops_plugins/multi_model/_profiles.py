"""Capability profiles: the format lives in core (:mod:`tokenops.routing.profiles`); re-exported
here for the multi-model plugins and scripts that import it from this package."""

from tokenops.routing.profiles import dimension_score, dump_profile, load_profiles, save_profile, wilson

__all__ = ["dimension_score", "dump_profile", "load_profiles", "save_profile", "wilson"]
