"""``python -m fl_sim.cli``: the ``fl-sim`` command."""

from fl_sim.cli import main

raise SystemExit(main())
