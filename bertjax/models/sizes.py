"""The one table of encoder sizes, shared by every variant.

tiny..medium follow the BERT miniatures (Turc et al., 2019); base and large are
the sizes of the BERT paper, which ALBERT's base and large share; xlarge and
xxlarge are ALBERT's (Lan et al., 2019, Table 1); electra-small is ELECTRA's
small discriminator (Clark et al., 2020: BERT-base depth at width 256), whose
base and large are BERT's. A variant picks a row with ``config.model_size``.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Size:
  num_layers: int
  hidden_size: int
  num_heads: int
  mlp_dim: int


SIZES: dict[str, Size] = {
    "tiny": Size(num_layers=2, hidden_size=128, num_heads=2, mlp_dim=512),
    "mini": Size(num_layers=4, hidden_size=256, num_heads=4, mlp_dim=1024),
    "small": Size(num_layers=4, hidden_size=512, num_heads=8, mlp_dim=2048),
    "medium": Size(num_layers=8, hidden_size=512, num_heads=8, mlp_dim=2048),
    "electra-small": Size(num_layers=12, hidden_size=256, num_heads=4, mlp_dim=1024),
    "base": Size(num_layers=12, hidden_size=768, num_heads=12, mlp_dim=3072),
    "large": Size(num_layers=24, hidden_size=1024, num_heads=16, mlp_dim=4096),
    "xlarge": Size(num_layers=24, hidden_size=2048, num_heads=16, mlp_dim=8192),
    "xxlarge": Size(num_layers=12, hidden_size=4096, num_heads=64, mlp_dim=16384),
}


def get_size(name: str) -> Size:
  """Returns the row of SIZES named ``name``, or raises a ValueError listing them."""
  try:
    return SIZES[name]
  except KeyError:
    raise ValueError(
        f"Unknown model_size {name!r}; set --config.model_size to one of "
        f"{', '.join(SIZES)}.") from None


def check_config_arg(name: str, *, suffix: str = "") -> None:
  """Raises a ValueError when the size a config file was asked for (the
  ``ARG`` of ``--config=FILE:ARG``) is not a row of SIZES, optionally
  followed by ``suffix`` (XLNet's ``_mem``)."""
  if (name.removesuffix(suffix) if suffix else name) not in SIZES:
    example = (f"each with or without {suffix}, as in --config=FILE:tiny{suffix}"
               if suffix else "as in --config=FILE:base")
    raise ValueError(
        f"Unknown size {name!r} after the config file's colon "
        f"(--config=FILE:{name}); pick one of {', '.join(SIZES)} ({example}).")


def resolve(config) -> Size:
  """The encoder size of ``config``.

  A config imported by ``python -m bertjax.convert`` spells its dimensions out
  (``num_layers``, ``hidden_size``, ``num_heads``, ``mlp_dim``; then
  ``model_size`` may be "custom"); bertjax's own configs name a row of SIZES.
  """
  fields = ("num_layers", "hidden_size", "num_heads", "mlp_dim")
  if all(config.get(f) for f in fields):
    return Size(**{f: int(config.get(f)) for f in fields})
  return get_size(config.get("model_size"))
