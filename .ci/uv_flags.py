"""The flags that give `uv pip install` pip's configuration: the Makefile installs through
uv, which reads no pip.conf and no PIP_* variable.

From `pip config list` (pip's files and its PIP_* variables; for an install, the `install`
section over `global`, the environment over both): the index, the extra indexes, the
find-links and the constraint files; and pip's way of choosing among several indexes (the
best version on any of them, where uv's default takes the first index that has the
package). Prints them on one line.
"""
import ast
import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}
PRECEDENCE = ("global", "install", ":env:")  # the later wins


def pip_settings() -> dict[str, list[str]]:
  listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], check=True,
                           capture_output=True, text=True).stdout
  found = []  # (precedence, key, values)
  for line in listing.splitlines():
    name, _, value = line.partition("=")
    section, _, key = name.rpartition(".")
    if key in FLAGS and section in PRECEDENCE:
      found.append((PRECEDENCE.index(section), key, ast.literal_eval(value).split()))
  return {key: values for _, key, values in sorted(found)}


def main():
  flags = ["--index-strategy", "unsafe-best-match"]
  for key, values in pip_settings().items():
    for value in values:
      flags += [FLAGS[key], value]
  print(" ".join(flags))


if __name__ == "__main__":
  main()
