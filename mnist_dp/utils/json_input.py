"""JSON that users write or edit (hyperparameters files, the keys file): read strictly.

Python's json keeps the last of two equal keys in an object without a word, so {"dp": true, ..., "dp": false}
would train without DP while its first line says otherwise; such a file is refused, naming the key.
"""
import json

from mnist_dp.utils.errors import UserError


def loads(text: str, where: str):
    """`text` parsed as JSON (json.JSONDecodeError as json.loads), refusing an object that holds a key twice: a
    UserError naming `where` (the file) and the key."""
    def unique(pairs: list) -> dict:
        values = {}
        for key, value in pairs:
            if key in values:
                raise UserError(f"{where}: key {json.dumps(key)} is given twice; keep one (JSON readers disagree on "
                                "which one counts)")
            values[key] = value
        return values

    return json.loads(text, object_pairs_hook=unique)
