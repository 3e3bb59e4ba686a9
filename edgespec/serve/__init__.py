"""``edgespec serve``: the HTTP app (:mod:`.server`: FastAPI on uvicorn, the queue,
one generation at a time), who may call it (:mod:`.guard`), OpenAI's wire format
(:mod:`.openai_api`, its fields checked in :mod:`.openai_fields`, :mod:`.grammars`,
:mod:`.sampler_order`, replies shaped by :mod:`.replies`, :mod:`.tool_calls`,
:mod:`.logprobs`), llama-server's native one (:mod:`.llama_api`,
:mod:`.native_routes`), ``/metrics`` (:mod:`.metrics`), what the routes share
(:mod:`.http`), errors in OpenAI's shape (:mod:`.errors`) and the chat page
(:mod:`.page`, ``web/``).

May import: api, session, measure, models, planner, drafters, backends, core, errors, paths.
"""
