"""Hardware profiles: what a wide-EP engine needs on one kind of node and fabric, as data.

The shipped profiles (data/hardware.yaml) name the public source of every value; a platform adds
or overrides profiles with its own file (``MOE_HARDWARE_PROFILES``). Nothing here reads a spec:
the recipe (moe_operator.recipe) combines a profile with a model and a pool.
"""

from .profile import EnvVar, HardwareProfile
from .registry import PROFILES_ENV, ProfilesError, known_profile, load_profiles, lookup_profile, profile_names

__all__ = [
    "PROFILES_ENV",
    "EnvVar",
    "HardwareProfile",
    "ProfilesError",
    "known_profile",
    "load_profiles",
    "lookup_profile",
    "profile_names",
]
