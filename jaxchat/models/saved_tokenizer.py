"""A tokenizer saved with `save_pretrained` (a GGUF's converted one), loaded the fast way on every later start.

Contract: `load_saved_tokenizer(saved)` returns the tokenizer in the folder `saved`, as the class its
tokenizer_config.json names would load it (`AutoTokenizer` when it names none transformers has). The first load
also pickles it to `saved/tokenizer.pickle`, behind a header naming the transformers and tokenizers versions and
this format; a later load whose header matches unpickles it instead (0.4 s for the default model's 150k-token
vocabulary against 0.7-1.4 s through `from_pretrained`, which parses tokenizer.json with Python's json module
several times). A header that differs, a file that cannot be read or a pickle that fails is a `from_pretrained`
and a fresh pickle; an unwritable folder only costs speed. The pickle executes what it holds on load, so the
folder must be as trusted as the code: it lives under the user's own asset cache, like the executable store.
"""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path
from typing import Any

from jaxchat.assets import atomic_write

log = logging.getLogger(__name__)
PICKLE_NAME = "tokenizer.pickle"
_FORMAT = 1


def _header() -> tuple:
    import tokenizers
    import transformers

    return ("jaxchat-tokenizer", _FORMAT, transformers.__version__, tokenizers.__version__)


def load_saved_tokenizer(saved: Path) -> Any:
    pickled = saved / PICKLE_NAME
    header = _header()
    try:
        with open(pickled, "rb") as f:
            if pickle.load(f) == header:
                return pickle.load(f)
    except FileNotFoundError:
        pass
    except Exception as exc:  # noqa: BLE001 - any broken pickle is read afresh below
        log.warning("could not unpickle the tokenizer in %s (%s); reading it again", pickled, exc)
    tokenizer = saved_tokenizer_class(saved).from_pretrained(str(saved))
    try:
        with atomic_write(pickled) as out:
            pickle.dump(header, out)
            pickle.dump(tokenizer, out, protocol=pickle.HIGHEST_PROTOCOL)
    except (OSError, pickle.PicklingError, TypeError, AttributeError) as exc:
        log.debug("could not pickle the tokenizer to %s (%s)", pickled, exc)
    return tokenizer


def saved_tokenizer_class(saved: Path):
    """The class `save_pretrained` named in `saved`'s tokenizer_config.json (what `AutoTokenizer` would pick), taken
    from transformers directly: `AutoTokenizer`'s own lookup imports the model configurations and, through them,
    torch (2.8 s of a warm start's 3.9 s tokenizer load here). `AutoTokenizer` when it names none transformers
    has."""
    import transformers

    try:
        name = json.loads((saved / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError):
        name = None
    found = getattr(transformers, name, None) if isinstance(name, str) and name.isidentifier() else None
    if isinstance(found, type) and hasattr(found, "from_pretrained"):
        return found
    from transformers import AutoTokenizer

    return AutoTokenizer
