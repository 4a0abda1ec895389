"""JSON the bundle reads (hyperparameters files, the keys file, manifests, model files, results):
read strictly.

Python's json keeps the last of two equal keys in an object without a word, so {"dp": true, ...,
"dp": false} would train without DP while its first line says otherwise; such a file is refused,
naming the key. An integer longer than any value of the bundle (options.MAX_DIGITS) is refused too,
naming the file: past 4,300 digits Python would fail with a traceback of its own; so is a value
nested too deeply for Python's parser.
"""
import json
from pathlib import Path

from mnist_dp.utils.errors import UserError
from mnist_dp.utils.options import MAX_DIGITS


def loads(text: str | bytes, where: str):
    """`text` parsed as JSON (json.JSONDecodeError as json.loads), refusing an object that holds a
    key twice or an integer of more than MAX_DIGITS digits: a UserError naming `where` (the
    file)."""
    def unique(pairs: list) -> dict:
        values = {}
        for key, value in pairs:
            if key in values:
                raise UserError(f"{where}: key {json.dumps(key)} is given twice; keep one (JSON "
                                "readers disagree on which one counts)")
            values[key] = value
        return values

    def integer(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_DIGITS:
            raise UserError(f"{where}: an integer of {len(digits.lstrip('-')):,} digits; no value "
                            f"this bundle reads has more than {MAX_DIGITS}: fix the file")
        return int(digits)

    try:
        return json.loads(text, object_pairs_hook=unique, parse_int=integer)
    except RecursionError:  # Python's parser recurses once per level of nesting
        raise UserError(f"{where}: nested too deeply to read (no file this bundle reads nests more "
                        "than a few levels); fix the file") from None


def read(path: Path, what: str):
    """The JSON value in the file at `path` (`what` it is, for messages); a UserError naming the
    file when it is missing, a folder, unreadable, not UTF-8 or not JSON."""
    path = Path(path)
    try:
        return loads(path.read_bytes().decode("utf-8"), str(path))
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a folder; give the path of the {what}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; save the {what} as UTF-8 JSON") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc}); fix the {what} or move it away") from None
