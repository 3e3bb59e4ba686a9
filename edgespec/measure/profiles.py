"""The pairing ``edgespec bench --save-profile`` recommends for a target, kept for
``edgespec chat`` and ``generate`` to use."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..errors import EdgespecError


def profile_path(target: str) -> Path:
    """Where the saved pairing of a target lives: keyed by the model's content, so
    two models that share a file name (in different folders) never share one."""
    from ..models.catalog import edgespec_home, model_fingerprint
    name = Path(str(target).rstrip("/")).name.replace("/", "_") or "model"
    return edgespec_home() / "profiles" / f"{name}-{model_fingerprint(target)}.json"


def save_profile(target: str, recommendation: dict) -> Path | None:
    """Store the pairing ``edgespec bench`` recommends for ``target`` (None: plain won)."""
    if recommendation["mode"] == "plain":
        return None
    path = profile_path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"target": target, "draft": recommendation["drafter"],
                                    "num_draft": recommendation["num_draft"],
                                    "speedup": recommendation["speedup"],
                                    "measured": time.strftime("%Y-%m-%d %H:%M")}, indent=1))
    except OSError as e:
        raise EdgespecError(f"could not save the profile to {path}: {e.strerror or e} "
                            f"(set EDGESPEC_HOME to a writable folder)") from None
    return path


def load_profile(target: str) -> dict | None:
    """The saved pairing of ``target``, if ``edgespec bench --save-profile`` stored one."""
    path = profile_path(target)
    try:
        profile = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        profile = None
    k = profile.get("num_draft") if isinstance(profile, dict) else None
    if isinstance(profile, dict) and isinstance(profile.get("draft"), str) and profile["draft"] \
            and (k == "auto" or (isinstance(k, int) and not isinstance(k, bool) and k >= 1)):
        return profile
    print(f"edgespec: ignoring the saved profile {path}: it is not a drafter and k "
          f"(run `edgespec bench --save-profile` again)", file=sys.stderr)
    return None
