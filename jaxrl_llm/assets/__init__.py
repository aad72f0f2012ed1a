"""Files the package ships: the demo's warm-start checkpoint (HF format + tokenizer)."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
  """The directory of shipped asset `name`, e.g. `path('arithmetic_sft')`."""
  full = os.path.join(HERE, name)
  if not os.path.isdir(full):
    available = sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d))
                       and not d.startswith("_"))
    raise FileNotFoundError(f"no shipped asset {name!r}; available: {available}")
  return full
