"""What measures: ``edgespec bench`` (:mod:`.bench`, :mod:`.bench_report`), ``edgespec
verify`` (:mod:`.selfcheck`), the copy ceiling (:mod:`.ceiling`), the saved pairing
(:mod:`.profiles`), the built-in prompt sets (:mod:`.prompt_sets`) and a run's clock,
recorded and replayed (:mod:`.replay`). The costs auto
mode measures as it runs live with the planner (:mod:`edgespec.planner.costs`).

May import: models, planner, drafters, backends, core, errors, paths.
"""
