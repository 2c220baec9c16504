"""The registered attacks, one module each: a module of this package that registers an attack
(:data:`attacks.plugin.register`) is all a new attack takes, with its tests and its table."""

import sys

from attacks.plugin import ATTACKS

ATTACKS.discover(sys.modules[__name__])
