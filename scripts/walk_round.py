"""The walk of one round (from the engine's loop to the committed tokens): the edgespec
modules the calls pass through, in order, consecutive calls in one module collapsed;
and how many times each module is entered."""
import dataclasses
import sys
from collections import Counter

import edgespec
from edgespec.models.catalog import resolve_model
from edgespec.core.sampling import SamplingParams

engine = edgespec.load(str(resolve_model("smollm2-135m-instruct", fetch=True)), draft="lookup")
walk, rounds, spine = [], [0], []
original = engine._round


def profile(frame, event, arg):
    if event == "call":
        name = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        # An entry: a call into an edgespec module from another module (a call within
        # one module, or a return, is not an entry).
        # (Reading a value a call returned, a Draft's length or a Verdict's tokens, is
        # not entering its module.)
        if name.startswith("edgespec") and name != caller \
                and not dataclasses.is_dataclass(frame.f_locals.get("self")):
            walk.append((name.removeprefix("edgespec."), frame.f_code.co_name))
            if caller == "edgespec.core.engine":  # the round's spine: what the engine calls
                spine.append((name.removeprefix("edgespec."), frame.f_code.co_name))


def traced(run):
    rounds[0] += 1
    if rounds[0] != 3 or run.speculative is False:  # a round well into the reply
        return original(run)
    sys.setprofile(profile)
    try:
        return original(run)
    finally:
        sys.setprofile(None)


engine._round = traced
text = "Repeat this list exactly: apples, pears, plums, cherries, apples, pears, plums, cherries."
engine.chat([{"role": "user", "content": text}], stream=False, temperature=0, max_tokens=60)
engine.close()
print(" -> ".join(f"{m}.{f}" for m, f in walk))
print("rounds", rounds[0]); print(dict(Counter(m for m, _ in walk).most_common()))
print("spine:", " -> ".join(f"{m}.{f}" for m, f in spine))
print("spine entries:", dict(Counter(m for m, _ in spine).most_common()))
