"""Reading a JSONL data file (questions, problems, a corpus): one JSON object a line.

    for number, where, obj in jsonl.objects(path, "corpus"):   # where = "PATH, line N"
      ...

Blank lines are skipped. Every fault is a ValueError naming the file, and the line where there is
one: a file that cannot be read, text that is not UTF-8, a line that is not JSON or not a JSON
object. The caller parses each object (its own fields) and says what an empty file lacks.
"""

import json
from typing import Any, Dict, Iterator, Tuple


def objects(path: str, what: str) -> Iterator[Tuple[int, str, Dict[str, Any]]]:
  """(line number, "PATH, line N", object) of each non-blank line; `what` names the file in the
  error of a file that cannot be read ("cannot read the {what} file ...")."""
  try:
    with open(path, encoding="utf-8") as f:
      for number, line in enumerate(f, 1):
        if not line.strip():  # blank lines (a trailing one, say) hold nothing
          continue
        where = f"{path}, line {number}"
        try:
          obj = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{where}: not JSON ({e.msg})") from e
        if not isinstance(obj, dict):
          raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        yield number, where, obj
  except OSError as e:
    raise ValueError(f"cannot read the {what} file {path}: {e}") from e
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text: {e}") from e
