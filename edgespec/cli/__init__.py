"""The ``edgespec`` command: :mod:`.main` (its subcommands), :mod:`.options` (the
options they share), :mod:`.chat` (``edgespec chat``), :mod:`.info`.

May import: serve, api, session, measure, models, planner, drafters, backends, core, errors, paths.
"""
