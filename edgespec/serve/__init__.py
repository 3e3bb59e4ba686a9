"""``edgespec serve``: the HTTP app (:mod:`.server`: FastAPI on uvicorn, the queue,
one generation at a time), OpenAI's wire format (:mod:`.openai_api`,
:mod:`.openai_fields`, :mod:`.replies`), llama-server's native one
(:mod:`.llama_api`, :mod:`.native_routes`), ``/metrics`` (:mod:`.metrics`), what the
routes share (:mod:`.http`), errors in OpenAI's shape (:mod:`.errors`) and the chat
page (:mod:`.page`, ``web/``).

May import: api, session, measure, models, planner, drafters, backends, core, errors, paths.
"""
