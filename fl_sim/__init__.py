"""fl-sim: the simulated federation, the judge (audit) and the user interface."""

import warnings

# Known and harmless, and nothing a user can act on: geoopt's use of the deprecated
# torch.jit.script (at its import) and Opacus' notice on full backward hooks. Filtered here, by
# message, because every process of a run imports fl_sim before those libraries (the command,
# the attack pool's spawned workers, Ray's client workers); any other warning still shows.
KNOWN_HARMLESS_WARNINGS: tuple[tuple[str, type[Warning]], ...] = (
    ("`torch.jit.script` is deprecated", FutureWarning),
    ("Full backward hook is firing", UserWarning),
)
for _message, _category in KNOWN_HARMLESS_WARNINGS:
    warnings.filterwarnings("ignore", message=_message, category=_category)
