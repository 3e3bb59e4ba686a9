"""llama-server's ``samplers``: the order of the sampling stages a request names, read
as llama-server reads it (a stage left out is not applied), and refused with a 400
where that order is a distribution edgespec cannot sample exactly."""

from __future__ import annotations

from .errors import ApiError, invalid

# llama.cpp's stage names, with its aliases (kebab-case, no dash, nucleus, temp, typ),
# and its one-letter codes (common/sampling.cpp).
_STAGES = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
           "temperature", "infill", "adaptive_p")
_ALIASES = {**{name: name for name in _STAGES}, **{n.replace("_", "-"): n for n in _STAGES},
            **{n.replace("_", ""): n for n in _STAGES}, "nucleus": "top_p", "temp": "temperature",
            "typ": "typ_p", "typical_p": "typ_p"}
_CODES = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
          "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p"}
FILTERS = ("top_k", "typ_p", "top_p", "min_p")  # edgespec's order of the filters


def samplers(value) -> tuple[str, ...] | None:
    """llama-server's ``samplers``: stage names (its aliases too) or a string of their
    letters (``"kypmt"``), as llama.cpp's canonical names."""
    if value is None:
        return None
    if isinstance(value, str):
        if bad := [c for c in value if c not in _CODES]:
            raise invalid(f"{bad[0]!r} is not a sampler letter (one of {''.join(_CODES)})")
        return tuple(_CODES[c] for c in value)
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise invalid("must be a list of sampler names or a string of sampler letters")
    if bad := [n for n in value if n.lower() not in _ALIASES]:
        raise invalid(f"{bad[0]!r} is not a sampler (one of {', '.join(_STAGES)})")
    return tuple(_ALIASES[n.lower()] for n in value)


def in_order(order: tuple[str, ...] | None, params, penalties: dict):
    """The sampling ``params`` and ``penalties`` (Shaping's fields) that ``order``
    (llama-server's ``samplers``) gives, exactly as llama-server reads it: a stage
    left out is not applied. An order edgespec cannot sample exactly is a 400: the
    filters must come as top_k, typ_p, top_p, min_p, the penalties before them and
    temperature, and temperature before or after all of typ_p, top_p and min_p
    that are on (llama.cpp's default order puts it after them)."""
    if order is None:
        return params, penalties
    if "infill" in order:
        raise ApiError(400, "the infill sampler is not supported: it changes the model's distribution "
                      "for fill-in-the-middle", param="samplers")
    off = {"top_k": {"top_k": 0}, "typ_p": {"typical_p": 1.0}, "top_p": {"top_p": 1.0},
           "min_p": {"min_p": 0.0}, "temperature": {"temperature": 1.0}}
    params = params.with_(**{k: v for stage, o in off.items() if stage not in order for k, v in o.items()})
    if "penalties" not in order:
        penalties = {**penalties, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
    on = {"top_k": 0 < params.top_k, "typ_p": params.typical_p < 1.0, "top_p": params.top_p < 1.0,
          "min_p": params.min_p > 0.0, "temperature": not params.greedy and params.temperature != 1.0,
          "penalties": penalties.get("repeat_penalty", 1.0) != 1.0 or bool(
              penalties.get("presence_penalty")) or bool(penalties.get("frequency_penalty"))}
    at = {stage: order.index(stage) for stage in order if on.get(stage)}
    filters = [f for f in sorted(at, key=at.get) if f in FILTERS]
    if filters != [f for f in FILTERS if f in at]:
        raise ApiError(400, f"edgespec applies the filters in the order {', '.join(FILTERS)}; "
                      f"{' before '.join(filters)} is another distribution",
                       param="samplers")
    if "penalties" in at and any(at[s] < at["penalties"] for s in at if s != "penalties"):
        raise ApiError(400, "the penalties must come before the filters and temperature", param="samplers")
    scaled = [at[f] > at["temperature"] for f in ("typ_p", "top_p", "min_p") if f in at] \
        if "temperature" in at else []
    if scaled and any(scaled) != all(scaled):
        raise ApiError(400, "temperature must come before all of typ_p, top_p and min_p that are on, or "
                      "after all of them", param="samplers")
    return params.with_(temperature_last=bool(scaled) and not scaled[0]), penalties


def applied_samplers(params) -> list[str]:
    """The stages a generation with ``params`` applies, in order (llama-server's names)."""
    return ["penalties", *FILTERS, "temperature"] if params.temperature_last else \
        ["penalties", "temperature", *FILTERS]
