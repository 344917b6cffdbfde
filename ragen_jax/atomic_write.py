"""Files replaced whole: a reader sees the old content or the new, never a part.

  atomic_write.write_text("runs/x/eval/step_4.jsonl", text)   # UTF-8 whatever the locale

The text goes to a temporary file beside the target, which `os.replace` then renames onto it
(atomic within one file system). A failure while writing (a full disk, an exception) removes the
temporary file and leaves the old file as it was.
"""

import os


def write_text(path: str, text: str) -> str:
  """Writes `text` to `path` as UTF-8, replacing the file whole; returns `path`.

  Missing parent directories are made. The temporary name carries the process id, so processes
  writing the same target never share a temporary file.
  """
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as fp:
      fp.write(text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return path
